package linear

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"

	"github.com/meshrun/meshrun/collective"
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
}

// MLP is one rank's share of the block.
type MLP struct {
	Cfg       MLPConfig
	Up, Down  *Layer
	gelu      *spmd.Plan
	geluBack  *spmd.Backward
	rank      int
	X, Target *tensor.Tensor // this rank's shards of the (fixed) batch
	bufs      scratch
}

// NewMLP plans the block for rank and initializes its parameters from the seed so
// that every sharding holds the same global parameters as the single-rank run.
func NewMLP(cfg MLPConfig, rank int) (*MLP, error) {
	mesh := cfg.Mesh
	tokens := "column"
	down := "row"
	if cfg.SequenceParallel {
		tokens, down = "sequence-column", "sequence-row"
	}
	up, err := Preset(tokens, mesh, cfg.Tokens, cfg.Hidden, cfg.FFN, true)
	if err != nil {
		return nil, err
	}
	up.Name = "up" // every gradient, the input's too: the block sits inside a network
	m := &MLP{Cfg: cfg, rank: rank, bufs: scratch{}}
	if m.Up, err = New(up, rank); err != nil {
		return nil, err
	}
	h := m.Up.Fwd.Final
	if m.gelu, err = spmd.Forward(spmd.Request{Op: "gelu", Inputs: []spmd.Operand{{Name: "h", Spec: h.Spec}}, Options: spmd.Options{Output: "g"}}); err != nil {
		return nil, err
	}
	if m.geluBack, err = spmd.BackwardOf(m.gelu, nil, nil); err != nil {
		return nil, err
	}
	dn, err := Preset(down, mesh, cfg.Tokens, cfg.FFN, cfg.Hidden, true)
	if err != nil {
		return nil, err
	}
	dn.Name, dn.X = "down", m.gelu.Final.Spec
	if m.Down, err = New(dn, rank); err != nil {
		return nil, err
	}
	if !m.Down.Bwd.Grads[0].Final.Spec.Equal(m.geluBack.DY.Spec) {
		return nil, fmt.Errorf("%w: mlp: down's dx %s does not meet gelu's dy %s", ErrConfig, m.Down.Bwd.Grads[0].Final.Spec, m.geluBack.DY.Spec)
	}
	// Where a weight gradient is complete on its rank, SGD runs inside its GEMM.
	m.Up.FuseSGD(cfg.LR)
	m.Down.FuseSGD(cfg.LR)
	// Parameters and the batch, whole on every rank from the seed, then sharded.
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6d6c70))
	w1 := randomTensor(rng, []int{cfg.FFN, cfg.Hidden}, 1/sqrt(cfg.Hidden))
	b1 := randomTensor(rng, []int{cfg.FFN}, 0.1)
	w2 := randomTensor(rng, []int{cfg.Hidden, cfg.FFN}, 1/sqrt(cfg.FFN))
	b2 := randomTensor(rng, []int{cfg.Hidden}, 0.1)
	x := randomTensor(rng, []int{cfg.Tokens, cfg.Hidden}, 1)
	target := randomTensor(rng, []int{cfg.Tokens, cfg.Hidden}, 1)
	for _, s := range []struct {
		dst  **tensor.Tensor
		src  *tensor.Tensor
		spec placement.Spec
	}{
		{&m.Up.W, w1, m.Up.Config.W}, {&m.Up.B, b1, *m.Up.Config.B},
		{&m.Down.W, w2, m.Down.Config.W}, {&m.Down.B, b2, *m.Down.Config.B},
		{&m.X, x, m.Up.X}, {&m.Target, target, m.Down.Fwd.Final.Spec},
	} {
		if *s.dst, err = Shard(s.src, s.spec, rank); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func sqrt(n int) float64 { return math.Sqrt(float64(max(n, 1))) }

// FLOPsPerStep is the multiply-adds of a training step times two: forward and
// the two backward GEMMs of both layers.
func (c MLPConfig) FLOPsPerStep() float64 {
	return 2 * 3 * 2 * float64(c.Tokens) * float64(c.Hidden) * float64(c.FFN)
}

// Step runs one training step: forward, loss, backward, gradient reduction, SGD.
// It returns the loss (the mean squared error over the whole batch, the same on
// every rank).
func (m *MLP) Step(ctx context.Context, rt Runtime) (float64, error) {
	h, upSaved, err := m.Up.Forward(ctx, rt, m.X)
	if err != nil {
		return 0, err
	}
	g := m.bufs.get("g", m.gelu.Final.Spec.LocalShape(m.rank))
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
	dh := m.bufs.get("dh", h.Shape())
	if err := rt.Kernels.GeluBackward(dh, dg, h); err != nil {
		return 0, err
	}
	// dx, the block input's gradient, goes to the layer before (none here).
	if _, err := m.Up.Backward(ctx, rt, dh, upSaved); err != nil {
		return 0, err
	}
	for _, l := range []*Layer{m.Up, m.Down} {
		dw, db, err := l.Reduce(ctx, rt)
		if err != nil {
			return 0, err
		}
		sgd(l.W, dw, m.Cfg.LR)
		sgd(l.B, db, m.Cfg.LR)
	}
	return loss, nil
}

// sgd updates p -= lr·g, split over the rank's cores for large tensors.
func sgd(p, g *tensor.Tensor, lr float32) {
	if p == nil || g == nil {
		return
	}
	pv, gv := p.Float32(), g.Float32()
	parallel(len(pv), func(_, lo, hi int) {
		pv, gv := pv[lo:hi], gv[lo:hi:hi]
		for i := range pv {
			pv[i] -= lr * gv[i]
		}
	})
}

// pieces is how many contiguous pieces parallel cuts n elements into.
func pieces(n int) int {
	const grain = 1 << 16
	return max(1, min(runtime.GOMAXPROCS(0), (n+grain-1)/grain))
}

// parallel runs f on piece k = [lo, hi) of [0, n) for every piece, concurrently.
func parallel(n int, f func(k, lo, hi int)) {
	parts := pieces(n)
	if parts == 1 {
		f(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	for k := 0; k < parts; k++ {
		lo, hi := k*n/parts, (k+1)*n/parts
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(k, lo, hi)
		}()
	}
	wg.Wait()
}

// mse returns the mean squared error of y against the target and its gradient,
// laid out as y. The loss sums this rank's squares, then adds the sums of the
// ranks holding other shards (one 1-element all-reduce, recorded as "loss").
func (m *MLP) mse(ctx context.Context, rt Runtime, y *tensor.Tensor) (float64, *tensor.Tensor, error) {
	spec := m.Down.Fwd.Final.Spec
	n := float32(spec.NumElems())
	dy := m.bufs.get("dy", y.Shape())
	yv, tv, dv := y.Float32(), m.Target.Float32(), dy.Float32()
	// Partial sums per piece (four interleaved accumulators each, for speed),
	// added in a fixed order: the same loss whatever the threads.
	sums := make([]float64, pieces(len(yv)))
	scale := 2 / n
	parallel(len(yv), func(k, lo, hi int) {
		var acc [4]float64
		i := lo
		for ; i+4 <= hi; i += 4 {
			for j := range 4 {
				d := yv[i+j] - tv[i+j]
				acc[j] += float64(d * d)
				dv[i+j] = d * scale
			}
		}
		for ; i < hi; i++ {
			d := yv[i] - tv[i]
			acc[0] += float64(d * d)
			dv[i] = d * scale
		}
		sums[k] = (acc[0] + acc[1]) + (acc[2] + acc[3])
	})
	var sum float64
	for _, s := range sums {
		sum += s
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
	steps, err := placement.Plan(from, from.WithPlacements(replicated(len(ps))...))
	if err != nil {
		return 0, nil, err
	}
	out, log, err := collective.Execute(ctx, rt.World, steps, []float64{sum})
	if err != nil {
		return 0, nil, err
	}
	if rt.Record != nil {
		for _, ex := range log {
			rt.Record("loss", ex)
		}
	}
	return out[0] / float64(n), dy, nil
}

func replicated(n int) []placement.Placement {
	ps := make([]placement.Placement, n)
	for i := range ps {
		ps[i] = placement.Replicate{}
	}
	return ps
}
