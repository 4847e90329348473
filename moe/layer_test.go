package moe_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/job"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/moe"
	"github.com/meshrun/meshrun/placement"
	sim "github.com/meshrun/meshrun/placement/placementref"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/spmd/spmdref"
	"github.com/meshrun/meshrun/tensor"
)

// layerCase is one layer's whole inputs, float32-exact, and its reference.
type layerCase struct {
	shape   spmd.MoEShape
	auxCoef float64
	x, dy   *tensor.Tensor
	p       moe.Params
	ref     spmdref.MoEOut
	grads   spmdref.MoEGrads
}

// newCase draws a layer at random. x's column 0 is 1 and the last expert's
// router weight there is -8: no token picks that expert.
func newCase(t testing.TB, s spmd.MoEShape, seed uint64) *layerCase {
	rng := rand.New(rand.NewPCG(seed, 5))
	draw := func(scale float64, shape ...int) *tensor.Tensor {
		d := make([]float32, tensor.NumElements(shape))
		for i := range d {
			d[i] = float32(scale * (2*rng.Float64() - 1))
		}
		x, _ := tensor.FromFloat32(d, shape...)
		return x
	}
	c := &layerCase{shape: s, auxCoef: 0.37, x: draw(1, s.T, s.H), dy: draw(1, s.T, s.H),
		p: moe.Params{Router: draw(0.8, s.E, s.H), W1: draw(0.5, s.E, s.F, s.H), B1: draw(0.3, s.E, s.F),
			W2: draw(0.5, s.E, s.H, s.F), B2: draw(0.3, s.E, s.H)}}
	for r := range s.T {
		c.x.Float32()[r*s.H] = 1
	}
	for e := range s.E {
		c.p.Router.Float32()[e*s.H] = 0
	}
	c.p.Router.Float32()[(s.E-1)*s.H] = -8
	m := spmdref.MoE{K: s.K, Capacity: s.Capacity}
	ps := spmdref.MoEParams{Router: ref(c.p.Router), W1: ref(c.p.W1), B1: ref(c.p.B1), W2: ref(c.p.W2), B2: ref(c.p.B2)}
	var err error
	if c.ref, err = spmdref.MoEForward(m, ref(c.x), ps); err != nil {
		t.Fatal(err)
	}
	if c.grads, err = spmdref.MoEBackward(m, ref(c.x), ps, ref(c.dy), c.auxCoef); err != nil {
		t.Fatal(err)
	}
	return c
}

func ref(t *tensor.Tensor) sim.Tensor {
	r := sim.New(t.Shape()...)
	for i, v := range t.Float32() {
		r.Data[i] = float64(v)
	}
	return r
}

// result is a run's whole outputs.
type result struct {
	y, dx, drouter, dw1, db1, dw2, db2 *tensor.Tensor
	stats                              moe.Stats
	planMatch                          bool
}

// run runs the layer on mesh, on device ("cpu" or "sim"), and gathers the
// outputs.
func run(t *testing.T, c *layerCase, mesh, device string) result {
	t.Helper()
	m, err := placement.ParseMesh(mesh)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := spmd.PlanMoE(m, c.shape, 4)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var out result
	err = job.InProcess(context.Background(), m.Size(), func(ctx context.Context, w *collective.World) error {
		k, err := providers.New(device, nil)
		if err != nil {
			return err
		}
		l, err := moe.New(moe.Config{Plan: plan, AuxCoef: c.auxCoef, DType: tensor.Float32}, w.Rank(), k, c.p)
		if err != nil {
			return err
		}
		// Gradient buffers full of NaN: whatever the backward leaves
		// unwritten (an idle expert's) shows.
		for _, g := range []*tensor.Tensor{l.DRouter, l.DW1, l.DB1, l.DW2, l.DB2} {
			if err := fillNaN(g); err != nil {
				return err
			}
		}
		first, n := l.Tokens()
		x, err := rows(k, c.x, first, n)
		if err != nil {
			return err
		}
		dy, err := rows(k, c.dy, first, n)
		if err != nil {
			return err
		}
		y, st, err := l.Forward(ctx, w, x)
		if err != nil {
			return err
		}
		dx, err := l.Backward(ctx, w, dy)
		if err != nil {
			return err
		}
		var r result
		r.stats, r.planMatch = st, l.PlanMatch()
		for _, g := range []struct {
			dst   **tensor.Tensor
			spec  placement.Spec
			local *tensor.Tensor
		}{
			{&r.y, plan.X, y}, {&r.dx, plan.X, dx}, {&r.drouter, plan.Router, l.DRouter},
			{&r.dw1, plan.W1, l.DW1}, {&r.db1, plan.B1, l.DB1}, {&r.dw2, plan.W2, l.DW2}, {&r.db2, plan.B2, l.DB2},
		} {
			if *g.dst, err = moe.Gather(ctx, w, g.spec, g.local); err != nil {
				return err
			}
		}
		if !r.planMatch {
			return fmt.Errorf("rank %d ran %+v, the plan lists %+v", w.Rank(), l.Executed, plan.Comms)
		}
		if w.Rank() == 0 {
			mu.Lock()
			out = r
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// fillNaN writes NaN into every element of device tensor g.
func fillNaN(g *tensor.Tensor) error {
	h := tensor.New(tensor.Float32, g.Shape()...)
	for i := range h.Float32() {
		h.Float32()[i] = float32(math.NaN())
	}
	if g.Len() == 0 {
		return nil
	}
	return tensor.MemoryOf(g).Write(g, 0, tensor.HostBytes(h), tensor.Transfer)
}

// idleZero checks that the idle last expert's gradients are exactly zero.
func idleZero(t *testing.T, r result) {
	t.Helper()
	for _, g := range []*tensor.Tensor{r.dw1, r.db1, r.dw2, r.db2} {
		n := g.Len() / g.Dim(0)
		for i, v := range g.Float32()[g.Len()-n:] {
			if v != 0 {
				t.Fatalf("the idle expert's gradient %v holds %v at %d, want exactly 0", g.Shape(), v, i)
			}
		}
	}
}

// rows uploads rows [first, first+n) of whole.
func rows(k tensor.Memory, whole *tensor.Tensor, first, n int) (*tensor.Tensor, error) {
	h := whole.Dim(1)
	r, err := tensor.FromFloat32(whole.Float32()[first*h:(first+n)*h], n, h)
	if err != nil {
		return nil, err
	}
	return tensor.Upload(k, r)
}

// relErr is max |got - want| / max |want|.
func relErr(got *tensor.Tensor, want sim.Tensor) float64 {
	var d, m float64
	for i, v := range want.Data {
		d = max(d, math.Abs(float64(got.Float32()[i])-v))
		m = max(m, math.Abs(v))
	}
	if m == 0 {
		return d
	}
	return d / m
}

func check(t *testing.T, c *layerCase, r result) {
	t.Helper()
	for _, o := range []struct {
		name string
		got  *tensor.Tensor
		want sim.Tensor
	}{
		{"y", r.y, c.ref.Y}, {"dx", r.dx, c.grads.DX}, {"drouter", r.drouter, c.grads.DRouter},
		{"dw1", r.dw1, c.grads.DW1}, {"db1", r.db1, c.grads.DB1}, {"dw2", r.dw2, c.grads.DW2}, {"db2", r.db2, c.grads.DB2},
	} {
		if e := relErr(o.got, o.want); e > 1e-5 {
			t.Errorf("%s: relative error %.3g over 1e-5", o.name, e)
		}
	}
	if math.Abs(r.stats.Aux-c.ref.Aux) > 1e-6*math.Abs(c.ref.Aux) {
		t.Errorf("aux %v, reference %v", r.stats.Aux, c.ref.Aux)
	}
	if fmt.Sprint(r.stats.Tokens) != fmt.Sprint(c.ref.Tokens) || r.stats.Dropped != c.ref.Dropped {
		t.Errorf("tokens per expert %v, dropped %d; reference %v, %d", r.stats.Tokens, r.stats.Dropped, c.ref.Tokens, c.ref.Dropped)
	}
}

// TestLayerMatchesReference runs the layer on meshes of 1 to 8 ranks, 1-, 2-
// and 3-D, with T not divisible by the ranks, E = 6 where ep does not
// always divide it, and an expert no token picks, against the float64
// reference: the output, the aux loss, the counts and every gradient.
func TestLayerMatchesReference(t *testing.T) {
	for _, tc := range []struct {
		mesh     string
		capacity float64
	}{
		{"ep=1", 0}, {"ep=4", 0}, {"ep=2,tp=2", 0}, {"dp=2,ep=2", 0}, {"ep=3", 0}, {"tp=2", 0}, {"dp=3", 0},
		{"ep=4", 1}, {"dp=2,ep=2", 0.75}, {"dp=2,ep=2,tp=2", 0}, {"ep=2,dp=2,tp=2", 1.25},
	} {
		t.Run(fmt.Sprintf("%s/c=%v", tc.mesh, tc.capacity), func(t *testing.T) {
			c := newCase(t, spmd.MoEShape{T: 13, H: 8, F: 6, E: 6, K: 2, Capacity: tc.capacity}, 3)
			if c.ref.Tokens[5] != 0 {
				t.Fatalf("expert 5 got %d tokens; the case wants it idle", c.ref.Tokens[5])
			}
			r := run(t, c, tc.mesh, "cpu")
			check(t, c, r)
			idleZero(t, r)
		})
	}
}

// TestLayerOnSim runs the layer's tensors on the simulated device: every
// copy and collective goes through device memory. Both tests start from
// gradient buffers full of NaN and check that the expert no token picks
// gets gradients of exactly zero, written.
func TestLayerOnSim(t *testing.T) {
	for _, mesh := range []string{"ep=2,tp=2", "dp=2,ep=3"} {
		t.Run(mesh, func(t *testing.T) {
			c := newCase(t, spmd.MoEShape{T: 11, H: 8, F: 6, E: 6, K: 2}, 9)
			r := run(t, c, mesh, "sim")
			check(t, c, r)
			idleZero(t, r)
		})
	}
}
