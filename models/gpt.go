package models

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// GPTConfig describes a GPT-2 style decoder trained with tensor parallelism
// on a 1-D mesh (tp), Megatron's layout:
//
//   - a vocabulary-parallel token embedding (rows split over tp, the lookup's
//     partial sums all-reduced) plus a learned position embedding;
//   - Layers pre-norm blocks: x += proj(attention(qkv(ln1(x)))), x +=
//     down(gelu(up(ln2(x)))), with qkv and up column-parallel (whole heads per
//     rank) and proj and down row-parallel (one all-reduce each forward, one
//     for qkv's and up's input gradients backward);
//   - a final layer norm and an untied head split by vocabulary, whose
//     cross-entropy combines each shard's max, sum of exponentials and target
//     logit (one all-gather of 3 numbers per token) and never gathers logits.
type GPTConfig struct {
	Mesh                                      placement.Mesh
	Vocab, Dim, Heads, Layers, Context, Batch int
	Seed                                      uint64
	// Optimizer is "adamw" (the default: β = 0.9, 0.95, eps 1e-8, weight
	// decay WeightDecay on the matrices) or "sgd".
	Optimizer       string
	LR, WeightDecay float64
	// Planner plans the model's layers and moves (see linear.Config.Planner), each
	// within a placement.DefaultBudget of its own, sharing its cache: a
	// layer repeated is planned once.
	Planner *placement.Planner
	// SequenceParallel splits the tokens over tp outside the linear layers
	// (Megatron's sequence parallelism): layer norms and residual adds run
	// on each rank's rows, the column-parallel layers all-gather their input
	// and the row-parallel ones reduce-scatter their output instead of one
	// all-reduce, the embedding's partial sums are reduce-scattered, and the
	// layer norms' parameter gradients (partial over the rows) all-reduced.
	SequenceParallel bool
	// DType is the compute dtype (0: float32). With bfloat16 the
	// activations, the linear layers' GEMMs and the collectives of
	// activations run in bfloat16; parameters, their gradients and AdamW's
	// moments stay float32 (bfloat16 copies of the parameters are refreshed
	// after each update), as mlp's mixed precision.
	DType tensor.DType
}

// Compute is the compute dtype (DType, float32 by default).
func (c GPTConfig) Compute() tensor.DType {
	if c.DType == 0 {
		return tensor.Float32
	}
	return c.DType
}

// Tokens is the tokens of one step, Batch × Context.
func (c GPTConfig) Tokens() int { return c.Batch * c.Context }

func (c GPTConfig) check() error {
	switch {
	case c.Mesh.NDim() != 1:
		return fmt.Errorf("%w: gpt: mesh %s: one dim (tensor parallel)", linear.ErrConfig, c.Mesh)
	case c.Vocab < 1 || c.Dim < 1 || c.Heads < 1 || c.Layers < 0 || c.Context < 1 || c.Batch < 1:
		return fmt.Errorf("%w: gpt: vocab %d, dim %d, heads %d, layers %d, context %d, batch %d: all at least 1 (layers 0)",
			linear.ErrConfig, c.Vocab, c.Dim, c.Heads, c.Layers, c.Context, c.Batch)
	case c.Dim%c.Heads != 0:
		return fmt.Errorf("%w: gpt: dim %d is not a multiple of heads %d", linear.ErrConfig, c.Dim, c.Heads)
	case c.Heads%c.Mesh.Size() != 0:
		return fmt.Errorf("%w: gpt: %d heads do not split over tp = %d (each rank holds whole heads)", linear.ErrConfig, c.Heads, c.Mesh.Size())
	case c.Vocab < c.Mesh.Size():
		return fmt.Errorf("%w: gpt: vocabulary %d smaller than tp = %d", linear.ErrConfig, c.Vocab, c.Mesh.Size())
	case c.Compute() != tensor.Float32 && c.Compute() != tensor.BFloat16:
		return fmt.Errorf("%w: gpt: dtype %v (float32 or bfloat16)", linear.ErrConfig, c.Compute())
	case c.Optimizer != "" && c.Optimizer != "adamw" && c.Optimizer != "sgd":
		return fmt.Errorf("%w: gpt: optimizer %q (adamw or sgd)", linear.ErrConfig, c.Optimizer)
	}
	return nil
}

// GPT is one rank's share of the model and its optimizer state.
type GPT struct {
	Cfg     GPTConfig
	rank    int
	mem     tensor.Memory
	bufs    linear.Scratch
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
	ceMove         spmd.Move // the cross-entropy stats, all-gathered
	// nextMove gathers one row of logits (sampling), planned on first use.
	nextMove spmd.Move
	params   []*param
	posIDs   *tensor.Tensor // every token's position
	posLocal *tensor.Tensor // this rank's rows' positions (posIDs unless sequence parallel)
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
	ln1, ln2            lnParams
	qkv, proj, up, down *linear.Layer
}

// NewGPT plans the model for rank and initializes it from the seed, GPT-2's
// way (normal(0, 0.02) weights, the residual projections scaled by
// 1/√(2·layers), zero biases, unit layer norms), drawing the whole model on
// every rank in one order and keeping the rank's shards: every tp holds the
// same global model.
func NewGPT(cfg GPTConfig, rank int, mem tensor.Memory) (*GPT, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if mem == nil {
		mem = tensor.Host
	}
	if cfg.Optimizer == "" {
		cfg.Optimizer = "adamw"
	}
	ctx := context.Background()
	pl := linear.PlannerFor(cfg.Planner, cfg.Compute())
	g := &GPT{Cfg: cfg, rank: rank, mem: mem, bufs: linear.Scratch{}}
	var err error
	mesh, t, d, v := cfg.Mesh, cfg.Tokens(), cfg.Dim, cfg.Vocab
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x677074))
	normal := func(shape []int, std float64) *tensor.Tensor {
		x := tensor.New(tensor.Float32, shape...)
		for i := range x.Float32() {
			x.Float32()[i] = float32(rng.NormFloat64() * std)
		}
		return x
	}
	fill := func(n int, val float32) *tensor.Tensor {
		x := tensor.New(tensor.Float32, n)
		for i := range x.Float32() {
			x.Float32()[i] = val
		}
		return x
	}
	// The embedding, vocabulary-parallel (Megatron's layout, whatever the
	// sizes): rows split over tp, each rank's lookup a partial sum of the
	// output, all-reduced.
	tableSpec := placement.MustSpec([]int{v, d}, mesh, placement.Shard{Dim: 0})
	_, off := tableSpec.Local(rank)
	g.vocab0 = off[0]
	partial := placement.MustSpec([]int{t, d}, mesh, placement.Partial{Op: placement.Sum})
	rowSpec := partial.WithPlacements(placement.Replicate{})
	if cfg.SequenceParallel {
		rowSpec = partial.WithPlacements(placement.Shard{Dim: 0})
		if g.dxMove, err = planMove(ctx, pl, "dx_embedding", rowSpec, rowSpec.WithPlacements(placement.Replicate{})); err != nil {
			return nil, err
		}
		lp := placement.MustSpec([]int{(2*cfg.Layers + 1) * 2 * d}, mesh, placement.Partial{Op: placement.Sum})
		if g.lnMove, err = planMove(ctx, pl, "ln_grads", lp, lp.WithPlacements(placement.Replicate{})); err != nil {
			return nil, err
		}
		_, off := rowSpec.Local(rank)
		g.rows = off[0]
	}
	if g.embMove, err = planMove(ctx, pl, "embedding", partial, rowSpec); err != nil {
		return nil, err
	}
	// held adds a parameter the model holds itself (not a layer's), laid out
	// as spec, from its global value x.
	held := func(name string, x *tensor.Tensor, spec placement.Spec, decay bool) (*param, error) {
		local, err := linear.Shard(x, spec, rank)
		if err != nil {
			return nil, err
		}
		w, err := tensor.Upload(mem, local)
		if err != nil {
			return nil, err
		}
		gr, err := mem.Alloc(tensor.Float32, w.Shape()...)
		if err != nil {
			return nil, err
		}
		p := &param{name: name, spec: spec, w: w, g: gr, decay: decay}
		if dt := cfg.Compute(); dt != tensor.Float32 {
			if p.cw, err = mem.Alloc(dt, w.Shape()...); err != nil {
				return nil, err
			}
		}
		g.params = append(g.params, p)
		return p, nil
	}
	replicated := func(shape ...int) placement.Spec {
		return placement.MustSpec(shape, mesh, placement.Replicate{})
	}
	if g.wte, err = held("wte", normal([]int{v, d}, 0.02), tableSpec, true); err != nil {
		return nil, err
	}
	if g.wpe, err = held("wpe", normal([]int{cfg.Context, d}, 0.01), replicated(cfg.Context, d), true); err != nil {
		return nil, err
	}
	ln := func(name string) (lnParams, error) {
		var ps [2]*param
		for i, part := range []struct {
			suffix string
			init   float32
		}{{".weight", 1}, {".bias", 0}} {
			p, err := held(name+part.suffix, fill(d, part.init), replicated(d), false)
			if err != nil {
				return lnParams{}, err
			}
			// The layer-norm kernels write gradients in the compute dtype
			// (the embeddings' are float32: their kernel reads a widened dy).
			if dt := cfg.Compute(); dt != tensor.Float32 {
				if p.cg, err = mem.Alloc(dt, d); err != nil {
					return lnParams{}, err
				}
			}
			ps[i] = p
		}
		return lnParams{ps[0], ps[1]}, nil
	}
	layer := func(name, preset string, n, k int, bias bool, std float64) (*linear.Layer, error) {
		if cfg.SequenceParallel {
			preset = "sequence-" + preset
		}
		lo, err := layout.Preset(preset, mesh, t, k, n, bias)
		if err != nil {
			return nil, err
		}
		c := linear.ConfigOf(name, lo)
		c.Planner, c.DType = pl.WithBudget(placement.DefaultBudget), cfg.DType
		if preset == "column" || preset == "sequence-column" {
			// Column parallel: y stays split by output features, as the next
			// op reads it. The planner picks how (for a small vocabulary the
			// head may split tokens and gather its weight: cheaper under its
			// model than all-reducing dx backward).
			c.Out = []placement.Placement{placement.Shard{Dim: 1}}
		}
		plans, err := linear.PlanContext(ctx, c)
		if err != nil {
			return nil, err
		}
		l, err := linear.NewPlanned(c, plans, rank, mem)
		if err != nil {
			return nil, err
		}
		w, err := linear.Shard(normal([]int{n, k}, std), c.W, rank)
		if err != nil {
			return nil, err
		}
		var b *tensor.Tensor
		if bias {
			if b, err = linear.Shard(fill(n, 0), *c.B, rank); err != nil {
				return nil, err
			}
		}
		if err := l.SetParams(w, b); err != nil {
			return nil, err
		}
		g.params = append(g.params, &param{name: name + ".weight", spec: c.W, w: l.W, decay: true, layer: l})
		if bias {
			g.params = append(g.params, &param{name: name + ".bias", spec: *c.B, w: l.B, layer: l, bias: true})
		}
		return l, nil
	}
	resid := 0.02 / math.Sqrt(float64(2*max(cfg.Layers, 1)))
	for i := 0; i < cfg.Layers; i++ {
		b := &gptBlock{}
		p := fmt.Sprintf("h.%d.", i)
		if b.ln1, err = ln(p + "ln_1"); err != nil {
			return nil, err
		}
		if b.qkv, err = layer(p+"attn.c_attn", "column", 3*d, d, true, 0.02); err != nil {
			return nil, err
		}
		if b.proj, err = layer(p+"attn.c_proj", "row", d, d, true, resid); err != nil {
			return nil, err
		}
		if b.ln2, err = ln(p + "ln_2"); err != nil {
			return nil, err
		}
		if b.up, err = layer(p+"mlp.c_fc", "column", 4*d, d, true, 0.02); err != nil {
			return nil, err
		}
		if b.down, err = layer(p+"mlp.c_proj", "row", d, 4*d, true, resid); err != nil {
			return nil, err
		}
		g.blocks = append(g.blocks, b)
	}
	if g.lnf, err = ln("ln_f"); err != nil {
		return nil, err
	}
	if g.head, err = layer("lm_head", "column", v, d, false, 0.02); err != nil {
		return nil, err
	}
	// The cross-entropy stats: each rank's [T, 3], gathered into [tp, T, 3].
	stats := placement.MustSpec([]int{mesh.Size() * t, 3}, mesh, placement.Shard{Dim: 0})
	if g.ceMove, err = planMove(ctx, pl, "ce_stats", stats, stats.WithPlacements(placement.Replicate{})); err != nil {
		return nil, err
	}
	pos := tensor.New(tensor.Float32, t)
	for i := range pos.Float32() {
		pos.Float32()[i] = float32(i % cfg.Context)
	}
	if g.posIDs, err = tensor.Upload(mem, pos); err != nil {
		return nil, err
	}
	g.posLocal = g.posIDs
	if cfg.SequenceParallel {
		n := rowSpec.LocalShape(rank)[0]
		local := tensor.New(tensor.Float32, n)
		for i := range local.Float32() {
			local.Float32()[i] = float32((g.rows + i) % cfg.Context)
		}
		if g.posLocal, err = tensor.Upload(mem, local); err != nil {
			return nil, err
		}
	}
	for _, p := range g.params {
		for _, s := range []**tensor.Tensor{&p.m, &p.v} {
			if cfg.Optimizer == "adamw" {
				if *s, err = mem.Alloc(tensor.Float32, p.w.Shape()...); err != nil {
					return nil, err
				}
			}
		}
	}
	if err := g.refresh(cpuCaster{}); err != nil {
		return nil, err
	}
	return g, nil
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

// Params lists the model's parameters for checkpoints (--init), as this
// rank holds them.
func (g *GPT) Params() []linear.Param {
	var out []linear.Param
	for _, p := range g.params {
		out = append(out, linear.HeldParam(p.name, p.spec, p.w))
	}
	return out
}

// State lists the parameters and the optimizer's state, what a resumed run
// needs to go on as if never stopped: AdamW's moments under PyTorch's names
// (NAME.exp_avg, NAME.exp_avg_sq); the step count is the checkpoint's step
// (SetStep).
func (g *GPT) State() []linear.Param {
	var out []linear.Param
	for _, p := range g.params {
		out = append(out, linear.HeldParam(p.name, p.spec, p.w))
		if p.m != nil {
			out = append(out, linear.HeldParam(p.name+".exp_avg", p.spec, p.m), linear.HeldParam(p.name+".exp_avg_sq", p.spec, p.v))
		}
	}
	return out
}

// SetStep sets the number of optimizer steps taken (a resumed run's).
func (g *GPT) SetStep(n int) { g.step = n }

// PlanGPT checks cfg as NewGPT does and lists what a checkpoint of the model
// holds (State's names and layouts; their tensors nil, nothing allocated);
// withState false lists the parameters only (Params).
func PlanGPT(cfg GPTConfig, withState bool) ([]linear.Param, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	mesh, t, d, v := cfg.Mesh, cfg.Tokens(), cfg.Dim, cfg.Vocab
	var out []linear.Param
	add := func(name string, s placement.Spec) {
		out = append(out, linear.Param{Name: name, Spec: s})
		if withState && cfg.Optimizer != "sgd" {
			out = append(out, linear.Param{Name: name + ".exp_avg", Spec: s}, linear.Param{Name: name + ".exp_avg_sq", Spec: s})
		}
	}
	rep := func(shape ...int) placement.Spec { return placement.MustSpec(shape, mesh, placement.Replicate{}) }
	layer := func(name, preset string, n, k int, bias bool) error {
		l, err := layout.Preset(preset, mesh, t, k, n, bias)
		if err != nil {
			return err
		}
		add(name+".weight", l.W)
		if bias {
			add(name+".bias", *l.B)
		}
		return nil
	}
	add("wte", placement.MustSpec([]int{v, d}, mesh, placement.Shard{Dim: 0}))
	add("wpe", rep(cfg.Context, d))
	norm := func(name string) {
		add(name+".weight", rep(d))
		add(name+".bias", rep(d))
	}
	for i := 0; i < cfg.Layers; i++ {
		p := fmt.Sprintf("h.%d.", i)
		norm(p + "ln_1")
		for _, l := range []struct {
			name, preset string
			n, k         int
		}{{"attn.c_attn", "column", 3 * d, d}, {"attn.c_proj", "row", d, d}} {
			if err := layer(p+l.name, l.preset, l.n, l.k, true); err != nil {
				return nil, err
			}
		}
		norm(p + "ln_2")
		for _, l := range []struct {
			name, preset string
			n, k         int
		}{{"mlp.c_fc", "column", 4 * d, d}, {"mlp.c_proj", "row", d, 4 * d}} {
			if err := layer(p+l.name, l.preset, l.n, l.k, true); err != nil {
				return nil, err
			}
		}
	}
	norm("ln_f")
	if err := layer("lm_head", "column", v, d, false); err != nil {
		return nil, err
	}
	return out, nil
}

// GPTParam is one of the model's parameters as this rank holds it.
type GPTParam struct {
	Name  string // GPT-2's: wte, h.0.attn.c_attn.weight, ...
	Spec  placement.Spec
	W     *tensor.Tensor
	Decay bool // AdamW's weight decay applies
}

// Parameters lists the model's parameters in a fixed order.
func (g *GPT) Parameters() []GPTParam {
	var out []GPTParam
	for _, p := range g.params {
		out = append(out, GPTParam{p.name, p.spec, p.w, p.decay})
	}
	return out
}

// blockActs is what one block's forward keeps for its backward.
type blockActs struct {
	x, x2, st1, st2, qkv, o, lse, u *tensor.Tensor
	qkvS, projS, upS, downS         *linear.Saved
}

// Step runs one training step on ids and targets (each [Batch·Context]
// token ids held as float32, on the rank's device, the same on every rank):
// forward, the cross-entropy loss, backward and the optimizer. It returns the
// mean loss over the step's tokens, the same on every rank; one float64 comes
// back to the host.
func (g *GPT) Step(ctx context.Context, rt linear.Runtime, ids, targets *tensor.Tensor) (float64, error) {
	loss, acts, err := g.forward(ctx, rt, ids, targets)
	if err != nil {
		return 0, err
	}
	if err := g.backward(ctx, rt, ids, targets, acts); err != nil {
		return 0, err
	}
	return loss, g.update(ctx, rt)
}

// Loss runs the forward only and returns the mean loss (held-out text).
func (g *GPT) Loss(ctx context.Context, rt linear.Runtime, ids, targets *tensor.Tensor) (float64, error) {
	loss, _, err := g.forward(ctx, rt, ids, targets)
	return loss, err
}

type gptActs struct {
	blocks      []blockActs
	xf, stf, hf *tensor.Tensor
	logits, lse *tensor.Tensor
	headS       *linear.Saved
}

// get is a float32 scratch tensor (statistics, ids, float32 gradients).
func (g *GPT) get(rt linear.Runtime, name string, shape ...int) (*tensor.Tensor, error) {
	return g.bufs.Get(rt.Kernels, name, tensor.Float32, shape)
}

// act is a scratch tensor in the compute dtype (activations and their
// gradients).
func (g *GPT) act(rt linear.Runtime, name string, shape ...int) (*tensor.Tensor, error) {
	return g.bufs.Get(rt.Kernels, name, g.Cfg.Compute(), shape)
}

// caster casts between dtypes on the rank's device.
type caster interface {
	Cast(dst, src *tensor.Tensor) error
}

// cpuCaster casts host tensors (NewGPT's parameters, before any runtime).
type cpuCaster struct{}

func (cpuCaster) Cast(dst, src *tensor.Tensor) error {
	h, err := tensor.Download(src)
	if err != nil {
		return err
	}
	c, err := tensor.Convert(h, dst.DType())
	if err != nil {
		return err
	}
	return tensor.MemoryOf(dst).Write(dst, 0, tensor.HostBytes(c), tensor.Transfer)
}

// refresh copies the held parameters into their compute-dtype copies.
func (g *GPT) refresh(k caster) error {
	for _, p := range g.params {
		if p.cw != nil {
			if err := k.Cast(p.cw, p.w); err != nil {
				return err
			}
		}
	}
	return nil
}

// layerNorm runs x's layer norm into scratch name (and its stats).
func (g *GPT) layerNorm(rt linear.Runtime, name string, x *tensor.Tensor, p lnParams) (y, stats *tensor.Tensor, err error) {
	t, d := x.Dim(0), x.Dim(1)
	if y, err = g.act(rt, name, t, d); err != nil {
		return nil, nil, err
	}
	if stats, err = g.get(rt, name+".stats", t, 2); err != nil {
		return nil, nil, err
	}
	err = rt.Op("layernorm", func() error { return rt.Kernels.LayerNorm(y, stats, x, p.gamma.compute(), p.beta.compute(), gptEps) })
	return y, stats, err
}

// gptEps is the layer norms' epsilon (PyTorch's default).
const gptEps = 1e-5

// residual returns a copy of x in scratch name with d added.
func (g *GPT) residual(rt linear.Runtime, name string, x, d *tensor.Tensor) (*tensor.Tensor, error) {
	y, err := g.bufs.CopyOf(name, x)
	if err != nil {
		return nil, err
	}
	return y, rt.Kernels.Axpy(1, d, y)
}

func (g *GPT) forward(ctx context.Context, rt linear.Runtime, ids, targets *tensor.Tensor) (float64, *gptActs, error) {
	c := g.Cfg
	t, d := c.Tokens(), c.Dim
	hl, hd := c.Heads/c.Mesh.Size(), c.Dim/c.Heads
	emb, err := g.act(rt, "emb", t, d)
	if err != nil {
		return 0, nil, err
	}
	if err := rt.Op("embedding", func() error { return rt.Kernels.Embedding(emb, ids, g.wte.compute(), g.vocab0) }); err != nil {
		return 0, nil, err
	}
	x, err := linear.Execute(ctx, rt, "gpt", "embedding", g.embMove, emb, g.rank, g.bufs, "forward")
	if err != nil {
		return 0, nil, err
	}
	pos, err := g.act(rt, "pos", x.Shape()...)
	if err != nil {
		return 0, nil, err
	}
	if err := rt.Kernels.Embedding(pos, g.posLocal, g.wpe.compute(), 0); err != nil {
		return 0, nil, err
	}
	if err := rt.Kernels.Axpy(1, pos, x); err != nil {
		return 0, nil, err
	}
	acts := &gptActs{}
	for i, b := range g.blocks {
		a := blockActs{x: x}
		name := fmt.Sprintf("h%d.", i)
		h1, st1, err := g.layerNorm(rt, name+"ln1", x, b.ln1)
		if err != nil {
			return 0, nil, err
		}
		a.st1 = st1
		qkv, qs, err := b.qkv.Forward(ctx, rt, h1)
		if err != nil {
			return 0, nil, err
		}
		a.qkvS = qs
		if a.qkv, err = qkv.Reshape(c.Batch, c.Context, hl, 3, hd); err != nil {
			return 0, nil, err
		}
		if a.o, err = g.act(rt, name+"o", c.Batch, c.Context, hl, hd); err != nil {
			return 0, nil, err
		}
		if a.lse, err = g.get(rt, name+"lse", c.Batch, hl, c.Context); err != nil {
			return 0, nil, err
		}
		if err := rt.Op("attention", func() error { return rt.Kernels.Attention(a.o, a.lse, a.qkv, nil, nil, true) }); err != nil {
			return 0, nil, err
		}
		o2, err := a.o.Reshape(t, hl*hd)
		if err != nil {
			return 0, nil, err
		}
		p, ps, err := b.proj.Forward(ctx, rt, o2)
		if err != nil {
			return 0, nil, err
		}
		a.projS = ps
		if a.x2, err = g.residual(rt, name+"x2", x, p); err != nil {
			return 0, nil, err
		}
		h2, st2, err := g.layerNorm(rt, name+"ln2", a.x2, b.ln2)
		if err != nil {
			return 0, nil, err
		}
		a.st2 = st2
		u, us, err := b.up.Forward(ctx, rt, h2)
		if err != nil {
			return 0, nil, err
		}
		a.u, a.upS = u, us
		gl, err := g.act(rt, name+"gelu", u.Shape()...)
		if err != nil {
			return 0, nil, err
		}
		if err := rt.Op("gelu", func() error { return rt.Kernels.GeluForward(gl, u) }); err != nil {
			return 0, nil, err
		}
		dn, ds, err := b.down.Forward(ctx, rt, gl)
		if err != nil {
			return 0, nil, err
		}
		a.downS = ds
		if x, err = g.residual(rt, name+"x3", a.x2, dn); err != nil {
			return 0, nil, err
		}
		acts.blocks = append(acts.blocks, a)
	}
	acts.xf = x
	if acts.hf, acts.stf, err = g.layerNorm(rt, "lnf", x, g.lnf); err != nil {
		return 0, nil, err
	}
	if acts.logits, acts.headS, err = g.head.Forward(ctx, rt, acts.hf); err != nil {
		return 0, nil, err
	}
	stats, err := g.get(rt, "ce.stats", t, 3)
	if err != nil {
		return 0, nil, err
	}
	if err := rt.Op("cross_entropy", func() error { return rt.Kernels.CrossEntropy(stats, acts.logits, targets, g.vocab0) }); err != nil {
		return 0, nil, err
	}
	all, err := linear.Execute(ctx, rt, "gpt", "ce_stats", g.ceMove, stats, g.rank, g.bufs, "forward")
	if err != nil {
		return 0, nil, err
	}
	if all, err = all.Reshape(c.Mesh.Size(), t, 3); err != nil {
		return 0, nil, err
	}
	if acts.lse, err = g.get(rt, "ce.lse", t); err != nil {
		return 0, nil, err
	}
	sum, err := g.bufs.Get(rt.Kernels, "ce.sum", tensor.Float64, []int{1})
	if err != nil {
		return 0, nil, err
	}
	if err := rt.Kernels.CrossEntropyCombine(acts.lse, sum, all); err != nil {
		return 0, nil, err
	}
	host, err := tensor.Download(sum)
	if err != nil {
		return 0, nil, err
	}
	return host.Float64()[0] / float64(t), acts, nil
}

func (g *GPT) backward(ctx context.Context, rt linear.Runtime, ids, targets *tensor.Tensor, acts *gptActs) error {
	c := g.Cfg
	t := c.Tokens()
	hl, hd := c.Heads/c.Mesh.Size(), c.Dim/c.Heads
	dl, err := g.act(rt, "ce.dlogits", acts.logits.Shape()...)
	if err != nil {
		return err
	}
	if err := rt.Op("cross_entropy_backward", func() error {
		return rt.Kernels.CrossEntropyBackward(dl, acts.logits, targets, acts.lse, g.vocab0, 1/float64(t))
	}); err != nil {
		return err
	}
	dhf, err := g.head.Backward(ctx, rt, dl, acts.headS)
	if err != nil {
		return err
	}
	dx, err := g.act(rt, "dx", acts.xf.Shape()...)
	if err != nil {
		return err
	}
	tmp, err := g.act(rt, "dln", acts.xf.Shape()...)
	if err != nil {
		return err
	}
	lnBack := func(into *tensor.Tensor, p lnParams, dy, x, stats *tensor.Tensor) error {
		return rt.Op("layernorm_backward", func() error {
			return rt.Kernels.LayerNormBackward(into, p.gamma.grad(), p.beta.grad(), dy, x, p.gamma.compute(), stats, false)
		})
	}
	if err := lnBack(dx, g.lnf, dhf, acts.xf, acts.stf); err != nil {
		return err
	}
	for i := len(g.blocks) - 1; i >= 0; i-- {
		b, a := g.blocks[i], acts.blocks[i]
		dg, err := b.down.Backward(ctx, rt, dx, a.downS)
		if err != nil {
			return err
		}
		du, err := g.act(rt, fmt.Sprintf("h%d.du", i), dg.Shape()...)
		if err != nil {
			return err
		}
		if err := rt.Op("gelu_backward", func() error { return rt.Kernels.GeluBackward(du, dg, a.u) }); err != nil {
			return err
		}
		dh2, err := b.up.Backward(ctx, rt, du, a.upS)
		if err != nil {
			return err
		}
		if err := lnBack(tmp, b.ln2, dh2, a.x2, a.st2); err != nil {
			return err
		}
		if err := rt.Kernels.Axpy(1, tmp, dx); err != nil {
			return err
		}
		do, err := b.proj.Backward(ctx, rt, dx, a.projS)
		if err != nil {
			return err
		}
		if do, err = do.Reshape(c.Batch, c.Context, hl, hd); err != nil {
			return err
		}
		dqkv, err := g.act(rt, fmt.Sprintf("h%d.dqkv", i), a.qkv.Shape()...)
		if err != nil {
			return err
		}
		if err := rt.Op("attention_backward", func() error {
			return rt.Kernels.AttentionBackward(dqkv, nil, nil, do, a.qkv, nil, nil, a.o, a.lse, true)
		}); err != nil {
			return err
		}
		flat, err := dqkv.Reshape(t, 3*hl*hd)
		if err != nil {
			return err
		}
		dh1, err := b.qkv.Backward(ctx, rt, flat, a.qkvS)
		if err != nil {
			return err
		}
		if err := lnBack(tmp, b.ln1, dh1, a.x, a.st1); err != nil {
			return err
		}
		if err := rt.Kernels.Axpy(1, tmp, dx); err != nil {
			return err
		}
	}
	if g.Cfg.SequenceParallel {
		// Each rank's rows of the input's gradient: gathered, every token's
		// gradient goes into the embeddings (each rank's vocabulary rows).
		if dx, err = linear.Execute(ctx, rt, "gpt", "dx_embedding", g.dxMove, dx, g.rank, g.bufs, "backward"); err != nil {
			return err
		}
	}
	if dx.DType() != tensor.Float32 { // the embeddings' gradients are float32
		d32, err := g.get(rt, "dx32", dx.Shape()...)
		if err != nil {
			return err
		}
		if err := rt.Kernels.Cast(d32, dx); err != nil {
			return err
		}
		dx = d32
	}
	if err := rt.Op("embedding_backward", func() error {
		return rt.Kernels.EmbeddingBackward(g.wpe.g, dx, g.posIDs, 0, false)
	}); err != nil {
		return err
	}
	// dx is whole on every rank: each scatters into its own vocabulary rows.
	return rt.Op("embedding_backward", func() error {
		return rt.Kernels.EmbeddingBackward(g.wte.g, dx, ids, g.vocab0, false)
	})
}

// norms are the layer norms' parameters (partial gradients under sequence
// parallelism).
func (g *GPT) norms() []*param {
	var out []*param
	for _, p := range g.params {
		if p.layer == nil && p != g.wte && p != g.wpe {
			out = append(out, p)
		}
	}
	return out
}

// reduceNorms all-reduces every layer norm's parameter gradient, partial
// over the rows under sequence parallelism, in one collective: packed into
// one buffer and back.
func (g *GPT) reduceNorms(ctx context.Context, rt linear.Runtime) error {
	ps := g.norms()
	d := g.Cfg.Dim
	buf, err := g.get(rt, "ln.grads", len(ps)*d)
	if err != nil {
		return err
	}
	n := 4 * d
	for i, p := range ps {
		if err := rt.Kernels.Copy2D(buf, i*n, n, p.g, 0, n, n, 1); err != nil {
			return err
		}
	}
	all, err := linear.Execute(ctx, rt, "gpt", "ln_grads", g.lnMove, buf, g.rank, g.bufs, "reduce")
	if err != nil {
		return err
	}
	for i, p := range ps {
		if err := rt.Kernels.Copy2D(p.g, 0, n, all, i*n, n, n, 1); err != nil {
			return err
		}
	}
	return nil
}

// update applies the optimizer to every parameter.
func (g *GPT) update(ctx context.Context, rt linear.Runtime) error {
	g.step++
	c := g.Cfg
	for _, p := range g.norms() {
		if p.cg != nil {
			if err := rt.Kernels.Cast(p.g, p.cg); err != nil {
				return err
			}
		}
	}
	if c.SequenceParallel {
		if err := g.reduceNorms(ctx, rt); err != nil {
			return err
		}
	}
	reduced := map[*linear.Layer][2]*tensor.Tensor{}
	for _, p := range g.params {
		grad := p.g
		if p.layer != nil {
			r, ok := reduced[p.layer]
			if !ok {
				dw, db, err := p.layer.Reduce(ctx, rt)
				if err != nil {
					return err
				}
				r = [2]*tensor.Tensor{dw, db}
				reduced[p.layer] = r
			}
			grad = r[0]
			if p.bias {
				grad = r[1]
			}
		}
		if grad == nil {
			return fmt.Errorf("%w: gpt: %s has no gradient", linear.ErrConfig, p.name)
		}

		var err error
		if c.Optimizer == "sgd" {
			err = rt.Kernels.Axpy(-c.LR, grad, p.w)
		} else {
			wd := 0.0
			if p.decay {
				wd = c.WeightDecay
			}
			err = rt.Op("adamw", func() error {
				return rt.Kernels.AdamW(kernels.AdamWParams{LR: c.LR, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: wd, Step: g.step}, p.w, grad, p.m, p.v)
			})
		}
		if err != nil {
			return fmt.Errorf("gpt: updating %s: %w", p.name, err)
		}
	}
	return g.refresh(rt.Kernels)
}

// Next returns the model's distribution of the token after position pos of
// the first sequence in ids (the forward of a whole step's batch; the rows
// after pos do not matter: attention is causal), softmax(logits/temp), the
// same on every rank: the row's vocabulary shards are all-gathered.
func (g *GPT) Next(ctx context.Context, rt linear.Runtime, ids *tensor.Tensor, pos int, temp float64) ([]float64, error) {
	c := g.Cfg
	if pos < 0 || pos >= c.Context {
		return nil, fmt.Errorf("%w: gpt: position %d outside the context of %d", linear.ErrConfig, pos, c.Context)
	}
	zeros, err := g.get(rt, "next.targets", c.Tokens())
	if err != nil {
		return nil, err
	}
	_, acts, err := g.forward(ctx, rt, ids, zeros)
	if err != nil {
		return nil, err
	}
	vl := acts.logits.Dim(1)
	row, err := g.act(rt, "next.row", 1, vl)
	if err != nil {
		return nil, err
	}
	n := vl * acts.logits.DType().Size()
	if err := rt.Kernels.Copy2D(row, 0, n, acts.logits, pos*n, n, n, 1); err != nil {
		return nil, err
	}
	if g.nextMove.Steps == nil {
		from := placement.MustSpec([]int{1, c.Vocab}, c.Mesh, placement.Shard{Dim: 1})
		if g.nextMove, err = planMove(ctx, nil, "next", from, from.WithPlacements(placement.Replicate{})); err != nil {
			return nil, err
		}
	}
	all, err := linear.Execute(ctx, rt, "gpt", "next", g.nextMove, row, g.rank, g.bufs, "sample")
	if err != nil {
		return nil, err
	}
	host, err := tensor.Download(all)
	if err != nil {
		return nil, err
	}
	if host, err = tensor.Convert(host, tensor.Float32); err != nil {
		return nil, err
	}
	logits := host.Float32()
	top := math.Inf(-1)
	for _, l := range logits {
		top = max(top, float64(l))
	}
	p := make([]float64, len(logits))
	var z float64
	for i, l := range logits {
		p[i] = math.Exp((float64(l) - top) / temp)
		z += p[i]
	}
	for i := range p {
		p[i] /= z
	}
	return p, nil
}
