package models

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/moe"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/redistribute"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// The mixture-of-experts GPT (GPTConfig.Experts > 0): each block's MLP is a
// moe.Layer planned by spmd.PlanMoE on the model's mesh, tp=N or ep=E,tp=N.
// The dense rest of the model is tensor parallel over tp as without experts
// and data parallel over ep: each ep rank runs its Batch/ep sequences, which
// are the layer's tokens there too, and the gradients of the parameters the
// model holds itself (embeddings, layer norms) are summed over ep here, the
// linear layers' by their own reductions (their tokens split over ep); the
// loss is normalized over the whole batch.

// moeParam is one of a layer's parameters as a checkpoint names it (after
// the block's prefix h.i.), its layout and whether AdamW decays it.
type moeParam struct {
	name  string
	spec  placement.Spec
	decay bool
}

func moeParams(pl *spmd.MoEPlan) []moeParam {
	return []moeParam{{"moe.router.weight", pl.Router, true}, {"moe.w1", pl.W1, true}, {"moe.b1", pl.B1, false},
		{"moe.w2", pl.W2, true}, {"moe.b2", pl.B2, false}}
}

// experts builds block i's mixture-of-experts layer and adds its parameters
// (prefix h.i.). The experts are drawn from the model's generator as the
// dense MLP's c_fc and c_proj are, expert after expert (w1 normal(0, 0.02),
// w2 normal(0, resid), zero biases): with one expert, the very draws of the
// dense model. The router, normal(0, 0.02), comes from a generator of its
// own per block, so that the rest of the model draws as without experts.
func (b *gptBuilder) experts(i int, prefix string, resid float64) (*moe.Layer, error) {
	g, cfg := b.g, b.g.Cfg
	k, ok := g.mem.(kernels.Compute)
	if !ok {
		return nil, fmt.Errorf("%w: gpt: experts need the rank's kernels as the model's memory", linear.ErrConfig)
	}
	if b.moePlan == nil {
		var err error
		if b.moePlan, err = cfg.moePlan(); err != nil {
			return nil, err
		}
	}
	d, e := cfg.Dim, cfg.Experts
	w1 := b.normal([]int{e, 4 * d, d}, 0.02)
	w2 := b.normal([]int{e, d, 4 * d}, resid)
	router := (&gptBuilder{rng: rand.New(rand.NewPCG(cfg.Seed, 0x726f75746572+uint64(i)))}).normal([]int{e, d}, 0.02)
	l, err := moe.New(moe.Config{Plan: b.moePlan, AuxCoef: cfg.AuxCoef, DType: tensor.Float32}, g.rank, k,
		moe.Params{Router: router, W1: w1, B1: tensor.New(tensor.Float32, e, 4*d), W2: w2, B2: tensor.New(tensor.Float32, e, d)})
	if err != nil {
		return nil, fmt.Errorf("gpt: block %d: %w", i, err)
	}
	held := [][2]*tensor.Tensor{{l.Router, l.DRouter}, {l.W1, l.DW1}, {l.B1, l.DB1}, {l.W2, l.DW2}, {l.B2, l.DB2}}
	for j, p := range moeParams(b.moePlan) {
		g.params = append(g.params, &param{name: prefix + p.name, spec: p.spec, w: held[j][0], g: held[j][1], decay: p.decay, expert: true})
	}
	return l, nil
}

// expertsForward runs block i's mixture of experts on h2 (ln2 of x2, this
// rank's tokens) and returns x2 plus its output; it adds the layer's aux
// loss to the step's.
func (g *GPT) expertsForward(ctx context.Context, rt linear.Runtime, i int, b *gptBlock, x2, h2 *tensor.Tensor) (*tensor.Tensor, error) {
	var y *tensor.Tensor
	var st moe.Stats
	err := rt.Op("moe", func() error {
		var err error
		y, st, err = b.moe.Forward(ctx, rt.World, h2)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("gpt: block %d: %w", i, err)
	}
	if i == 0 {
		g.aux = 0
	}
	g.aux += st.Aux
	return g.residual(rt, fmt.Sprintf("h%d.x3", i), x2, y)
}

// AuxLoss is the last forward's load-balancing loss as the objective adds
// it, AuxCoef times the sum over the blocks of each layer's aux (docs/moe.md:
// 1 per layer when balanced), the same on every rank; 0 without experts.
func (g *GPT) AuxLoss() float64 { return g.Cfg.AuxCoef * g.aux }

// Balance is the last forward's mean over the blocks of each layer's aux:
// 1 when the router spreads the tokens evenly (a little under or over when
// nearly so), up to Experts when all go to the same; 0 without experts.
func (g *GPT) Balance() float64 {
	if g.Cfg.Experts == 0 || len(g.blocks) == 0 {
		return 0
	}
	return g.aux / float64(len(g.blocks))
}

// local returns this rank's rows of ids and targets (the whole batch's):
// its ep coordinate's sequences, its cp coordinate's positions of every
// sequence, or ids and targets themselves without either.
func (g *GPT) local(rt linear.Runtime, ids, targets *tensor.Tensor) (*tensor.Tensor, *tensor.Tensor, error) {
	ids, err := g.localRows(rt, "local.ids", ids)
	if err != nil {
		return nil, nil, err
	}
	targets, err = g.localRows(rt, "local.targets", targets)
	return ids, targets, err
}

// localRows copies this rank's share of the batch's token vector t into
// scratch name: its ep (dp) coordinate's sequences, under cp its positions
// of each (cpRows); t itself when the batch is not split.
func (g *GPT) localRows(rt linear.Runtime, name string, t *tensor.Tensor) (*tensor.Tensor, error) {
	c := g.Cfg
	if c.CP() > 1 {
		return g.cpRows(rt, name, t)
	}
	if c.localBatch() == c.Batch {
		return t, nil
	}
	if t.Len() != c.Tokens() {
		return nil, fmt.Errorf("%w: gpt: %d token ids, want batch × context = %d", linear.ErrConfig, t.Len(), c.Tokens())
	}
	n := c.localTokens()
	out, err := g.get(rt, name, n)
	if err != nil {
		return nil, err
	}
	first := g.batchRank() * n
	return out, rt.Kernels.Copy2D(out, 0, 4*n, t, 4*first, 4*n, 4*n, 1)
}

// splitGroup is this rank's group along the dims before tp (ep, or dp and
// cp).
func (g *GPT) splitGroup() []int { return g.Cfg.Mesh.Group(g.rank, g.Cfg.splitDims()...) }

// splitName names the dims before tp as the collectives over them are
// recorded: ep, dp, cp or dp_cp.
func (c GPTConfig) splitName() string {
	names := c.Mesh.Names()
	return strings.Join(names[:len(names)-1], "_")
}

// reduceOverSplit sums over the dims before tp (ep, or dp and cp) the
// gradients of the parameters the model holds itself (the embeddings and
// layer norms: each rank's are its tokens'), packed into one buffer, in one
// all-reduce recorded as ep_grads, dp_grads, cp_grads or dp_cp_grads.
func (g *GPT) reduceOverSplit(ctx context.Context, rt linear.Runtime) error {
	dim := g.Cfg.splitName()
	var ps []*param
	n := 0
	for _, p := range g.params {
		if p.layer == nil && !p.expert {
			ps = append(ps, p)
			n += p.g.Len()
		}
	}
	buf, err := g.get(rt, "ep.grads", n)
	if err != nil {
		return err
	}
	copyAll := func(toBuf bool) error {
		at := 0
		for _, p := range ps {
			b := 4 * p.g.Len()
			var err error
			if toBuf {
				err = rt.Kernels.Copy2D(buf, at, b, p.g, 0, b, b, 1)
			} else {
				err = rt.Kernels.Copy2D(p.g, 0, b, buf, at, b, b, 1)
			}
			if err != nil {
				return err
			}
			at += b
		}
		return nil
	}
	if err := copyAll(true); err != nil {
		return err
	}
	end := func() {}
	if rt.Trace != nil {
		end = rt.Trace(dim+"_grads", "collective")
	}
	group := g.splitGroup()
	c, err := rt.World.Communicator(ctx, group, kernels.DeviceMemory(rt.Kernels))
	if err == nil {
		err = c.AllReduce(ctx, buf, collective.Sum)
	}
	end()
	if err != nil {
		return fmt.Errorf("gpt: gradients over %s: %w", dim, err)
	}
	if rt.Record != nil {
		rt.Record(dim+"_grads", redistribute.Executed{Kind: placement.AllReduce, MeshDims: g.Cfg.splitDims(), Group: group,
			InputElems: int64(n), Bytes: 4 * int64(n), Algorithm: c.Algorithm()})
	}
	return copyAll(false)
}

// recordExperts hands the runtime's Record the collectives the layers ran
// in the step (forward and backward), named moe_ and the tensor they moved
// ("all_to_all moe_x"): they run outside the planned moves.
func (g *GPT) recordExperts(rt linear.Runtime) {
	if rt.Record == nil {
		return
	}
	kinds := map[string]placement.StepKind{"all_gather": placement.AllGather, "all_reduce": placement.AllReduce, "all_to_all": placement.AllToAll}
	for _, b := range g.blocks {
		if b.moe == nil {
			continue
		}
		for _, c := range b.moe.Executed {
			k, ok := kinds[c.Kind]
			if !ok {
				continue
			}
			rt.Record("moe_"+c.Tensor, redistribute.Executed{Kind: k, MeshDims: c.MeshDims, Group: g.Cfg.Mesh.Group(g.rank, c.MeshDims...),
				Bytes: c.Bytes, Algorithm: "moe"})
		}
	}
}
