package models

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/moe"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/ring"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// GPT is one rank's share of the model and its optimizer state.
type GPT struct {
	Cfg GPTConfig
	// CPAttention is how attention runs over cp, as the planner chose for
	// the model's block: "ring", or "gather" (keys and values all-gathered,
	// at short contexts); "" before the first step or without cp.
	CPAttention string
	rank        int
	mem         tensor.Memory
	bufs        linear.Scratch
	// work holds what no micro-batch keeps past its own backward (the
	// backward's buffers when it is whole); a pipeline stage's
	// micro-batches share it while each has its own bufs.
	work    linear.Scratch
	step    int
	vocab0  int // the first vocabulary row this rank holds
	wte     *param
	wpe     *param
	blocks  []*gptBlock
	lnf     lnParams
	head    *linear.Layer
	embMove spmd.Move // the embedding's partial sums, all-reduced (reduce-scattered to rows)
	// Sequence parallel: dxMove gathers the rows of the input's gradient for
	// the embeddings' backward; lnMove all-reduces a layer norm's parameter
	// gradient. rows is the first row this rank holds.
	dxMove, lnMove spmd.Move
	rows           int
	streamRows     int       // the rows of the residual stream this rank holds
	ceMove         spmd.Move // the cross-entropy stats, all-gathered
	// nextMove gathers one row of logits (sampling), planned on first use.
	nextMove spmd.Move
	params   []*param
	posIDs   *tensor.Tensor    // every token's position
	posLocal *tensor.Tensor    // this rank's rows' positions (posIDs unless sequence parallel)
	aux      float64           // the last forward's sum of the layers' aux losses (experts)
	cpGroup  *collective.Group // the rank's group along cp, joined on the first forward
	// accum: the backward adds to the model's own parameters' gradients
	// (a step's micro-batches after the first) rather than overwriting them.
	accum bool
	// splitB: the backward computes the input gradients alone, weightPart
	// the parameters' (a pipeline stage under ZB-H1).
	splitB bool
	// grads are the parameters' reduced gradients, in params' order, from
	// Gradients to Apply; gradNorm the last step's global norm (ClipGrad).
	grads    []*tensor.Tensor
	gradNorm float64
}

// param is one parameter as this rank holds it (whole, or a shard laid out
// as spec), its gradient and its AdamW moments. A linear layer's parameters
// get their gradients from the layer (Reduce).
type param struct {
	name string
	spec placement.Spec
	w, g *tensor.Tensor
	m, v *tensor.Tensor
	// cw and cg: the compute-dtype copy of w and the gradient buffer the
	// kernels write (bfloat16 runs; nil: w and g themselves).
	cw, cg *tensor.Tensor
	decay  bool
	layer  *linear.Layer
	bias   bool
	// expert: a mixture-of-experts layer's parameter, whose gradient the
	// layer writes already reduced.
	expert bool
}

type lnParams struct{ gamma, beta *param }

// compute is the parameter as the kernels read it.
func (p *param) compute() *tensor.Tensor {
	if p.cw != nil {
		return p.cw
	}
	return p.w
}

// grad is the buffer the kernels write the parameter's gradient into.
func (p *param) grad() *tensor.Tensor {
	if p.cg != nil {
		return p.cg
	}
	return p.g
}

type gptBlock struct {
	index               int // the block's place in the model (h.index)
	ln1, ln2            lnParams
	qkv, proj, up, down *linear.Layer
	moe                 *moe.Layer      // instead of up and down, with experts
	ring                *ring.Attention // attention under cp, built on the first forward
}

// NewGPT plans the model for rank and initializes it from the seed, GPT-2's
// way (normal(0, 0.02) weights, the residual projections scaled by
// 1/√(2·layers), zero biases, unit layer norms), drawing the whole model on
// every rank in one order and keeping the rank's shards: every tp holds the
// same global model.
func NewGPT(cfg GPTConfig, rank int, mem tensor.Memory) (*GPT, error) {
	cfg = cfg.normalized()
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if mem == nil {
		mem = tensor.Host
	}
	if cfg.Optimizer == "" {
		cfg.Optimizer = "adamw"
	}
	g := &GPT{Cfg: cfg, rank: rank, mem: mem, bufs: linear.Scratch{}, work: linear.Scratch{}}
	b := &gptBuilder{ctx: context.Background(), g: g, pl: linear.PlannerFor(cfg.Planner, cfg.Compute()),
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x677074))}
	rows, err := b.planMoves()
	if err != nil {
		return nil, err
	}
	if err := b.parameters(); err != nil {
		return nil, err
	}
	if err := g.positions(rows); err != nil {
		return nil, err
	}
	if err := g.allocMoments(); err != nil {
		return nil, err
	}
	if err := g.refresh(cpuCaster{}); err != nil {
		return nil, err
	}
	return g, nil
}

// gptBuilder builds one rank's GPT: it plans the model's layers and its own
// moves with one planner, and draws the whole model's initial values from
// one generator in a fixed order, so that every rank draws the same.
type gptBuilder struct {
	ctx context.Context
	g   *GPT
	pl  *placement.Planner
	rng *rand.Rand
	// moePlan is the mixture-of-experts layer's plan (with experts), the
	// same for every block.
	moePlan *spmd.MoEPlan
}

// planMoves plans the moves the model runs itself, outside its layers: the
// embedding's partial sums (all-reduced, or reduce-scattered to rows under
// sequence parallelism), the cross-entropy stats' all-gather and, under
// sequence parallelism, the gather of the input gradient's rows and the
// all-reduce of the layer norms' parameter gradients. It returns the layout
// of the residual stream: every token on every rank, or each rank's rows.
func (b *gptBuilder) planMoves() (placement.Spec, error) {
	g, cfg := b.g, b.g.Cfg
	mesh, t, d := cfg.Mesh, cfg.Tokens(), cfg.Dim
	var err error
	// With ep or dp, the tokens are split over it as the batch (the dense
	// layers are data parallel over ep); with cp, each rank's positions of
	// every sequence (gpt_cp.go), split alike: over every dim before tp.
	tokens := placement.Placement(placement.Replicate{})
	if cfg.Mesh.NDim() > 1 {
		tokens = placement.Shard{Dim: 0}
	}
	// The embedding, vocabulary-parallel (Megatron's layout, whatever the
	// sizes): rows split over tp, each rank's lookup a partial sum of the
	// output, all-reduced.
	partial := cfg.specOver([]int{t, d}, tokens, placement.Partial{Op: placement.Sum})
	rowSpec := cfg.specOver([]int{t, d}, tokens, placement.Replicate{})
	if cfg.SequenceParallel {
		rowSpec = partial.WithPlacements(placement.Shard{Dim: 0})
		if g.dxMove, err = planMove(b.ctx, b.pl, "dx_embedding", rowSpec, rowSpec.WithPlacements(placement.Replicate{})); err != nil {
			return placement.Spec{}, err
		}
		// The part's layer norms: two a block, and the final one on the
		// last stage.
		norms := 2 * cfg.Layers
		if p := cfg.Part; p != nil {
			norms = 2 * (p.Hi - p.Lo)
		}
		if cfg.last() {
			norms++
		}
		if norms > 0 {
			lp := placement.MustSpec([]int{norms * 2 * d}, mesh, placement.Partial{Op: placement.Sum})
			if g.lnMove, err = planMove(b.ctx, b.pl, "ln_grads", lp, lp.WithPlacements(placement.Replicate{})); err != nil {
				return placement.Spec{}, err
			}
		}
		_, off := rowSpec.Local(g.rank)
		g.rows = off[0]
	}
	g.streamRows = rowSpec.LocalShape(g.rank)[0]
	if g.embMove, err = planMove(b.ctx, b.pl, "embedding", partial, rowSpec); err != nil {
		return placement.Spec{}, err
	}
	if n := rowSpec.LocalShape(g.rank)[0]; !cfg.SequenceParallel && n != cfg.localTokens() {
		return placement.Spec{}, fmt.Errorf("%w: gpt: rank %d holds %d token rows of the plan, want %d", linear.ErrConfig, g.rank, n, cfg.localTokens())
	}
	// The cross-entropy stats: each rank's [T, 3], gathered into [tp, T, 3]
	// (with ep, T the rank's tokens, gathered over tp only).
	stats := cfg.specOver([]int{mesh.Size() * cfg.localTokens(), 3}, placement.Shard{Dim: 0}, placement.Shard{Dim: 0})
	all := cfg.specOver(stats.Shape, placement.Shard{Dim: 0}, placement.Replicate{})
	if g.ceMove, err = planMove(b.ctx, b.pl, "ce_stats", stats, all); err != nil {
		return placement.Spec{}, err
	}
	return rowSpec, nil
}

// parameters draws the model's parameters in GPT-2's order (the embeddings,
// the blocks, the final layer norm, the head), building the layers that
// hold the linear ones.
func (b *gptBuilder) parameters() error {
	g, cfg := b.g, b.g.Cfg
	d, v := cfg.Dim, cfg.Vocab
	var err error
	tableSpec := cfg.spec([]int{v, d}, placement.Shard{Dim: 0})
	_, off := tableSpec.Local(g.rank)
	g.vocab0 = off[0]
	// A pipeline stage draws the whole model as every rank does and keeps
	// its part.
	wte, wpe := b.normal([]int{v, d}, 0.02), b.normal([]int{cfg.Context, d}, 0.01)
	if cfg.first() {
		if g.wte, err = b.held("wte", wte, tableSpec, true); err != nil {
			return err
		}
		if g.wpe, err = b.held("wpe", wpe, b.replicated(cfg.Context, d), true); err != nil {
			return err
		}
	}
	resid := 0.02 / math.Sqrt(float64(2*max(cfg.Layers, 1)))
	for i := 0; i < cfg.Layers; i++ {
		if !cfg.owns(i) {
			// Its weights drawn and dropped: qkv, proj, up and down (each
			// expert's, with experts; their routers draw from their own
			// generators).
			e := max(1, cfg.Experts)
			for _, n := range []int{3 * d * d, d * d, 4 * d * d * e, 4 * d * d * e} {
				for range n {
					b.rng.NormFloat64()
				}
			}
			continue
		}
		blk, err := b.block(i, resid)
		if err != nil {
			return err
		}
		g.blocks = append(g.blocks, blk)
	}
	if !cfg.last() {
		return nil
	}
	if g.lnf, err = b.norm("ln_f"); err != nil {
		return err
	}
	if g.head, err = b.layer("lm_head", "column", v, d, false, 0.02); err != nil {
		return err
	}
	return nil
}

// block builds block i, named as GPT-2's h.i: its layer norms, attention's
// qkv and output projection, the MLP's up and down projections; resid is
// the standard deviation of the projections into the residual stream.
func (b *gptBuilder) block(i int, resid float64) (*gptBlock, error) {
	d := b.g.Cfg.Dim
	blk := &gptBlock{index: i}
	p := fmt.Sprintf("h.%d.", i)
	var err error
	if blk.ln1, err = b.norm(p + "ln_1"); err != nil {
		return nil, err
	}
	if blk.qkv, err = b.layer(p+"attn.c_attn", "column", 3*d, d, true, 0.02); err != nil {
		return nil, err
	}
	if blk.proj, err = b.layer(p+"attn.c_proj", "row", d, d, true, resid); err != nil {
		return nil, err
	}
	blk.proj.SetPassDX(true) // into the attention's backward
	if blk.ln2, err = b.norm(p + "ln_2"); err != nil {
		return nil, err
	}
	if b.g.Cfg.Experts > 0 {
		blk.moe, err = b.experts(i, p, resid)
		return blk, err
	}
	if blk.up, err = b.layer(p+"mlp.c_fc", "column", 4*d, d, true, 0.02); err != nil {
		return nil, err
	}
	if blk.down, err = b.layer(p+"mlp.c_proj", "row", d, 4*d, true, resid); err != nil {
		return nil, err
	}
	blk.down.SetPassDX(true) // into the GELU's backward
	return blk, nil
}

// normal draws a float32 tensor of shape, each element normal(0, std).
func (b *gptBuilder) normal(shape []int, std float64) *tensor.Tensor {
	x := tensor.New(tensor.Float32, shape...)
	for i := range x.Float32() {
		x.Float32()[i] = float32(b.rng.NormFloat64() * std)
	}
	return x
}

// filled is a float32 vector of n elements, each val.
func filled(n int, val float32) *tensor.Tensor {
	x := tensor.New(tensor.Float32, n)
	for i := range x.Float32() {
		x.Float32()[i] = val
	}
	return x
}

// replicated is the layout of a parameter every rank holds whole.
func (b *gptBuilder) replicated(shape ...int) placement.Spec {
	return b.g.Cfg.spec(shape, placement.Replicate{})
}

// held adds a parameter the model holds itself (not a layer's), laid out
// as spec, from its global value x.
func (b *gptBuilder) held(name string, x *tensor.Tensor, spec placement.Spec, decay bool) (*param, error) {
	g := b.g
	local, err := linear.Shard(x, spec, g.rank)
	if err != nil {
		return nil, err
	}
	w, err := tensor.Upload(g.mem, local)
	if err != nil {
		return nil, err
	}
	gr, err := g.mem.Alloc(tensor.Float32, w.Shape()...)
	if err != nil {
		return nil, err
	}
	p := &param{name: name, spec: spec, w: w, g: gr, decay: decay}
	if dt := g.Cfg.Compute(); dt != tensor.Float32 {
		if p.cw, err = g.mem.Alloc(dt, w.Shape()...); err != nil {
			return nil, err
		}
	}
	g.params = append(g.params, p)
	return p, nil
}

// norm adds a layer norm's parameters, name.weight (ones) and name.bias
// (zeros), held whole on every rank and never decayed.
func (b *gptBuilder) norm(name string) (lnParams, error) {
	g, d := b.g, b.g.Cfg.Dim
	var ps [2]*param
	for i, part := range []struct {
		suffix string
		init   float32
	}{{".weight", 1}, {".bias", 0}} {
		p, err := b.held(name+part.suffix, filled(d, part.init), b.replicated(d), false)
		if err != nil {
			return lnParams{}, err
		}
		// The layer-norm kernels write gradients in the compute dtype
		// (the embeddings' are float32: their kernel reads a widened dy).
		if dt := g.Cfg.Compute(); dt != tensor.Float32 {
			if p.cg, err = g.mem.Alloc(dt, d); err != nil {
				return lnParams{}, err
			}
		}
		ps[i] = p
	}
	return lnParams{ps[0], ps[1]}, nil
}

// layer plans and builds a linear layer of the preset layout (its
// sequence-parallel variant under sequence parallelism) with W[n, k] drawn
// normal(0, std) and a zero bias, and adds its parameters.
func (b *gptBuilder) layer(name, preset string, n, k int, bias bool, std float64) (*linear.Layer, error) {
	g, cfg := b.g, b.g.Cfg
	if cfg.SequenceParallel {
		preset = "sequence-" + preset
	}
	lo, err := layout.Preset(preset, cfg.Mesh, cfg.Tokens(), k, n, bias)
	if err != nil {
		return nil, err
	}
	c := linear.ConfigOf(name, lo)
	c.Planner, c.DType = b.pl.WithBudget(placement.DefaultBudget), cfg.DType
	if preset == "column" || preset == "sequence-column" {
		// Column parallel: y stays split by output features, as the next
		// op reads it. The planner picks how (for a small vocabulary the
		// head may split tokens and gather its weight: cheaper under its
		// model than all-reducing dx backward).
		c.Out = []placement.Placement{placement.Shard{Dim: 1}}
		if nd := cfg.Mesh.NDim(); nd > 1 { // the tokens split over ep, dp, cp
			c.Out = make([]placement.Placement, nd)
			for i := range c.Out {
				c.Out[i] = placement.Shard{Dim: 0}
			}
			c.Out[nd-1] = placement.Shard{Dim: 1}
		}
	}
	plans, err := linear.PlanContext(b.ctx, c)
	if err != nil {
		return nil, err
	}
	l, err := linear.NewPlanned(c, plans, g.rank, g.mem)
	if err != nil {
		return nil, err
	}
	w, err := linear.Shard(b.normal([]int{n, k}, std), c.W, g.rank)
	if err != nil {
		return nil, err
	}
	var bv *tensor.Tensor
	if bias {
		if bv, err = linear.Shard(filled(n, 0), *c.B, g.rank); err != nil {
			return nil, err
		}
	}
	if err := l.SetParams(w, bv); err != nil {
		return nil, err
	}
	g.params = append(g.params, &param{name: name + ".weight", spec: c.W, w: l.W, decay: true, layer: l})
	if bias {
		g.params = append(g.params, &param{name: name + ".bias", spec: *c.B, w: l.B, layer: l, bias: true})
	}
	return l, nil
}

// positions uploads every token's position (posIDs, what the position
// embedding's gradient scatters by; under cp, the positions of the rank's
// chunks in each sequence) and those of the rows of the residual
// stream this rank holds, laid out as rows (posLocal: posIDs unless
// sequence parallel).
func (g *GPT) positions(rows placement.Spec) error {
	cfg := g.Cfg
	pos := tensor.New(tensor.Float32, cfg.localTokens())
	order := g.cpPositions()
	for i := range pos.Float32() {
		pos.Float32()[i] = float32(order[i%len(order)])
	}
	var err error
	if g.posIDs, err = tensor.Upload(g.mem, pos); err != nil {
		return err
	}
	g.posLocal = g.posIDs
	if cfg.SequenceParallel {
		n := rows.LocalShape(g.rank)[0]
		local := tensor.New(tensor.Float32, n)
		for i := range local.Float32() {
			local.Float32()[i] = float32((g.rows + i) % cfg.Context)
		}
		if g.posLocal, err = tensor.Upload(g.mem, local); err != nil {
			return err
		}
	}
	return nil
}

// allocMoments allocates AdamW's moments of every parameter (none for SGD).
func (g *GPT) allocMoments() error {
	for _, p := range g.params {
		for _, s := range []**tensor.Tensor{&p.m, &p.v} {
			if g.Cfg.Optimizer == "adamw" {
				var err error
				if *s, err = g.mem.Alloc(tensor.Float32, p.w.Shape()...); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// planMove plans moving tensor name from one layout to another, with pl's
// model and cache (nil: a placement.DefaultPlanner) within a
// placement.DefaultBudget of its own.
func planMove(ctx context.Context, pl *placement.Planner, name string, from, to placement.Spec) (spmd.Move, error) {
	steps, err := pl.WithBudget(placement.DefaultBudget).Plan(ctx, from, to)
	if err != nil {
		return spmd.Move{}, fmt.Errorf("gpt: %s: %w", name, err)
	}
	return spmd.Move{Tensor: name, From: from, To: to, Steps: steps}, nil
}

// Step runs one training step on ids and targets (each [Batch·Context]
// token ids held as float32, on the rank's device, the same on every rank;
// with ep or dp, each rank trains on its coordinate's Batch/ep (Batch/dp)
// sequences, under cp on its positions of each):
// forward, the cross-entropy loss, backward and the optimizer. It returns the
// mean loss over the step's tokens, the same on every rank; one float64 comes
// back to the host.
func (g *GPT) Step(ctx context.Context, rt linear.Runtime, ids, targets *tensor.Tensor) (float64, error) {
	ids, targets, err := g.local(rt, ids, targets)
	if err != nil {
		return 0, err
	}
	loss, acts, err := g.forward(ctx, rt, ids, targets)
	if err != nil {
		return 0, err
	}
	if err := g.backward(ctx, rt, ids, targets, acts); err != nil {
		return 0, err
	}
	g.recordExperts(rt)
	return loss, g.update(ctx, rt)
}

// Loss runs the forward only and returns the mean loss (held-out text).
func (g *GPT) Loss(ctx context.Context, rt linear.Runtime, ids, targets *tensor.Tensor) (float64, error) {
	ids, targets, err := g.local(rt, ids, targets)
	if err != nil {
		return 0, err
	}
	loss, _, err := g.forward(ctx, rt, ids, targets)
	return loss, err
}
