package models

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// MLPConfig describes a Megatron MLP block: y = W2·gelu(W1·x + b1) + b2 on a mesh
// whose last dim is tensor parallel (the other dims split tokens), trained with
// a mean squared error against a target and plain SGD.
type MLPConfig struct {
	Mesh                placement.Mesh
	Tokens, Hidden, FFN int
	// SequenceParallel splits tokens over tp outside the block: the input is
	// all-gathered before the first GEMM and the output reduce-scattered after
	// the second, instead of one all-reduce.
	SequenceParallel bool
	Seed             uint64
	LR               float32
	// DType is the compute dtype (0: float32); with bfloat16 the parameters
	// and SGD stay float32 (see linear.Config.DType). GradDType is the dtype
	// weight gradients are reduced in (0: DType).
	DType, GradDType tensor.DType
	// Planner plans the block (see linear.Config.Planner): its layout's ops
	// and its layers share its budget and cache.
	Planner *placement.Planner
}

// MLP is one rank's share of the block.
type MLP struct {
	Cfg       MLPConfig
	Up, Down  *linear.Layer
	gelu      *spmd.Plan
	geluBack  *spmd.Backward
	rank      int
	X, Target *tensor.Tensor // this rank's shards of the (fixed) batch
	mem       tensor.Memory
	bufs      linear.Scratch
}

// NewMLP plans the block for rank and initializes its parameters from the seed so
// that every sharding holds the same global parameters as the single-rank run.
// Parameters, the batch and every buffer of a step live in mem, the rank's
// device memory (nil: host memory); they are copied there once, here.
func NewMLP(cfg MLPConfig, rank int, mem tensor.Memory) (*MLP, error) {
	if mem == nil {
		mem = tensor.Host
	}
	p, err := cfg.plan(context.Background())
	if err != nil {
		return nil, err
	}
	m := &MLP{Cfg: cfg, rank: rank, mem: mem, bufs: linear.Scratch{}, gelu: p.gelu.Fwd, geluBack: p.gelu.Bwd}
	if m.Up, err = linear.NewPlanned(p.up, p.upPlans, rank, mem); err != nil {
		return nil, err
	}
	if m.Down, err = linear.NewPlanned(p.down, p.downPlans, rank, mem); err != nil {
		return nil, err
	}
	// Where a weight gradient is complete on its rank, SGD runs inside its GEMM.
	m.Up.FuseSGD(cfg.LR)
	m.Down.FuseSGD(cfg.LR)
	// Parameters and the batch, whole on every rank from the seed, then sharded.
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6d6c70))
	w1 := uniform(rng, []int{cfg.FFN, cfg.Hidden}, 1/sqrt(cfg.Hidden))
	b1 := uniform(rng, []int{cfg.FFN}, 0.1)
	w2 := uniform(rng, []int{cfg.Hidden, cfg.FFN}, 1/sqrt(cfg.FFN))
	b2 := uniform(rng, []int{cfg.Hidden}, 0.1)
	x := uniform(rng, []int{cfg.Tokens, cfg.Hidden}, 1)
	target := uniform(rng, []int{cfg.Tokens, cfg.Hidden}, 1)
	shards := make([]*tensor.Tensor, 6)
	for i, s := range []struct {
		src  *tensor.Tensor
		spec placement.Spec
	}{
		{w1, m.Up.Config.W}, {b1, *m.Up.Config.B}, {w2, m.Down.Config.W}, {b2, *m.Down.Config.B},
		{x, m.Up.X}, {target, m.Down.Fwd.Final.Spec},
	} {
		if shards[i], err = linear.Shard(s.src, s.spec, rank); err != nil {
			return nil, err
		}
	}
	if err := m.Up.SetParams(shards[0], shards[1]); err != nil {
		return nil, err
	}
	if err := m.Down.SetParams(shards[2], shards[3]); err != nil {
		return nil, err
	}
	for i, dst := range []**tensor.Tensor{&m.X, &m.Target} {
		h, err := tensor.Convert(shards[4+i], m.Up.Compute())
		if err != nil {
			return nil, err
		}
		if *dst, err = tensor.Upload(mem, h); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// mlpPlan is a block laid out and planned: its layout, its layers' configs
// and plans, and gelu's plans.
type mlpPlan struct {
	layout             layout.MLP
	up, down           linear.Config
	upPlans, downPlans linear.Plans
	gelu               layout.Op
}

// plan lays out and plans the block within ctx, every problem NewMLP would
// report about cfg found before anything is allocated.
func (c MLPConfig) plan(ctx context.Context) (mlpPlan, error) {
	dt := c.DType
	if dt == 0 {
		dt = tensor.Float32
	}
	pl := linear.PlannerFor(c.Planner, dt)
	l, err := c.layout(ctx, pl)
	if err != nil {
		return mlpPlan{}, err
	}
	p := mlpPlan{layout: l, up: linear.ConfigOf("up", l.Up), down: linear.ConfigOf("down", l.Down), gelu: l.Ops[1]}
	// Every gradient, the input's too: the block sits inside a network.
	p.up.DType, p.up.GradDType, p.up.Planner = c.DType, c.GradDType, pl
	p.down.DType, p.down.GradDType, p.down.Planner = c.DType, c.GradDType, pl
	if p.upPlans, err = linear.PlanContext(ctx, p.up); err != nil {
		return mlpPlan{}, err
	}
	if h, want := p.upPlans.Fwd.Final.Spec, p.gelu.Fwd.Inputs[0].Spec; !h.Equal(want) {
		return mlpPlan{}, fmt.Errorf("%w: mlp: up's h %s is not the layout's %s", linear.ErrConfig, h, want)
	}
	if p.downPlans, err = linear.PlanContext(ctx, p.down); err != nil {
		return mlpPlan{}, err
	}
	if dg, want := p.downPlans.Bwd.Grads[0].Final.Spec, p.gelu.Bwd.DY.Spec; !dg.Equal(want) {
		return mlpPlan{}, fmt.Errorf("%w: mlp: down's dx %s does not meet gelu's dy %s", linear.ErrConfig, dg, want)
	}
	return p, nil
}

// PlanMLP checks cfg as NewMLP does, without building the block or allocating
// anything, and returns the parameters the block would have: their names and
// layouts, what a checkpoint is checked against before any rank starts (their
// Tensor is nil).
func PlanMLP(cfg MLPConfig) ([]linear.Param, error) {
	ps, _, err := CheckMLP(context.Background(), cfg)
	return ps, err
}

// CheckMLP is PlanMLP within ctx (planning stops once ctx is done and draws
// on cfg.Planner's budget), and also estimates one rank's memory for the
// block in cfg's dtypes (layout.MLP.Memory).
func CheckMLP(ctx context.Context, cfg MLPConfig) ([]linear.Param, layout.Memory, error) {
	p, err := cfg.plan(ctx)
	if err != nil {
		return nil, layout.Memory{}, err
	}
	ps := append(linear.LayerParams("up", &linear.Layer{Config: p.up}), linear.LayerParams("down", &linear.Layer{Config: p.down})...)
	return ps, p.layout.Memory(p.up.Compute(), p.up.Wire()), nil
}

// Layout is the block's layout on cfg.Mesh (package layout: the definition
// `launcher plan --block mlp` shows, planned as it plans it: with a
// placement.DefaultPlanner).
func (c MLPConfig) Layout() (layout.MLP, error) { return c.layout(context.Background(), nil) }

func (c MLPConfig) layout(ctx context.Context, pl *placement.Planner) (layout.MLP, error) {
	l, err := layout.NewMLPWith(ctx, pl, c.Mesh, c.Tokens, c.Hidden, c.FFN, c.SequenceParallel)
	if err != nil {
		return layout.MLP{}, fmt.Errorf("%w: %w", linear.ErrConfig, err)
	}
	return l, nil
}

// uniform draws a float32 tensor of shape from rng, each element uniform in
// [-scale, scale).
func uniform(rng *rand.Rand, shape []int, scale float64) *tensor.Tensor {
	t := tensor.New(tensor.Float32, shape...)
	for i := range t.Float32() {
		t.Float32()[i] = float32((rng.Float64()*2 - 1) * scale)
	}
	return t
}

func sqrt(n int) float64 { return math.Sqrt(float64(max(n, 1))) }

// FLOPsPerStep is the multiply-adds of a training step times two: forward and
// the two backward GEMMs of both layers. A float64: no size overflows it.
func (c MLPConfig) FLOPsPerStep() float64 {
	return 2 * 3 * 2 * float64(c.Tokens) * float64(c.Hidden) * float64(c.FFN)
}

// Step runs one training step: forward, loss, backward, gradient reduction, SGD.
// It returns the loss (the mean squared error over the whole batch, the same on
// every rank). Everything stays on the device but the loss: one float64 comes
// back to the host.
func (m *MLP) Step(ctx context.Context, rt linear.Runtime) (float64, error) {
	h, upSaved, err := m.Up.Forward(ctx, rt, m.X)
	if err != nil {
		return 0, err
	}
	dt := m.Up.Compute()
	g, err := m.bufs.Get(rt.Kernels, "g", dt, m.gelu.Final.Spec.LocalShape(m.rank))
	if err != nil {
		return 0, err
	}
	if err := rt.Kernels.GeluForward(g, h); err != nil {
		return 0, err
	}
	y, downSaved, err := m.Down.Forward(ctx, rt, g)
	if err != nil {
		return 0, err
	}
	loss, dy, err := m.mse(ctx, rt, y)
	if err != nil {
		return 0, err
	}
	dg, err := m.Down.Backward(ctx, rt, dy, downSaved)
	if err != nil {
		return 0, err
	}
	dh, err := m.bufs.Get(rt.Kernels, "dh", dt, h.Shape())
	if err != nil {
		return 0, err
	}
	if err := rt.Kernels.GeluBackward(dh, dg, h); err != nil {
		return 0, err
	}
	// dx, the block input's gradient, goes to the layer before (none here).
	if _, err := m.Up.Backward(ctx, rt, dh, upSaved); err != nil {
		return 0, err
	}
	for _, l := range []*linear.Layer{m.Up, m.Down} {
		dw, db, err := l.Reduce(ctx, rt)
		if err != nil {
			return 0, err
		}
		for _, u := range [][2]*tensor.Tensor{{l.W, dw}, {l.B, db}} {
			if u[0] != nil && u[1] != nil {
				// p -= lr·g
				if err := rt.Kernels.Axpy(-float64(m.Cfg.LR), u[1], u[0]); err != nil {
					return 0, err
				}
			}
		}
	}
	return loss, nil
}

// mse returns the mean squared error of y against the target and its gradient,
// laid out as y. The loss sums this rank's squares on the device, adds the sums
// of the ranks holding other shards (one 1-element all-reduce, recorded as
// "loss"), and copies that one float64 to the host.
func (m *MLP) mse(ctx context.Context, rt linear.Runtime, y *tensor.Tensor) (float64, *tensor.Tensor, error) {
	spec := m.Down.Fwd.Final.Spec
	n := float32(spec.NumElems())
	dy, err := m.bufs.Get(rt.Kernels, "dy", y.DType(), y.Shape())
	if err != nil {
		return 0, nil, err
	}
	sum, err := m.bufs.Get(rt.Kernels, "loss", tensor.Float64, []int{1})
	if err != nil {
		return 0, nil, err
	}
	if err := rt.Kernels.MSE(dy, sum, y, m.Target, float64(2/n)); err != nil {
		return 0, nil, err
	}
	// The scalar is partial over the mesh dims that split y, replicated elsewhere.
	ps := make([]placement.Placement, spec.Mesh.NDim())
	for i, p := range spec.Placements {
		ps[i] = placement.Replicate{}
		if _, ok := p.(placement.Shard); ok {
			ps[i] = placement.Partial{Op: placement.Sum}
		}
	}
	from := placement.Spec{Shape: []int{1}, Mesh: spec.Mesh, Placements: ps}
	to := from.WithPlacements(replicated(len(ps))...)
	steps, err := placement.Plan(from, to)
	if err != nil {
		return 0, nil, err
	}
	total, err := linear.Execute(ctx, rt, "mlp", "loss", spmd.Move{Tensor: "loss", From: from, To: to, Steps: steps}, sum, m.rank, m.bufs, "loss")
	if err != nil {
		return 0, nil, err
	}
	host, err := tensor.Download(total)
	if err != nil {
		return 0, nil, err
	}
	return host.Float64()[0] / float64(n), dy, nil
}

func replicated(n int) []placement.Placement {
	ps := make([]placement.Placement, n)
	for i := range ps {
		ps[i] = placement.Replicate{}
	}
	return ps
}

// Params lists the block's parameters: up.weight [ffn, hidden], up.bias [ffn],
// down.weight [hidden, ffn], down.bias [hidden] (float32).
func (m *MLP) Params() []linear.Param {
	return append(linear.LayerParams("up", m.Up), linear.LayerParams("down", m.Down)...)
}
