package ring_test

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
	"github.com/meshrun/meshrun/ring"
	"github.com/meshrun/meshrun/tensor"
)

// whole is a case's global tensors and the reference results, in float64.
type whole struct {
	s, b, h, e, f int
	causal        bool
	q, k, v, do   *tensor.Tensor // float64 [B, S, H, ·]
	o, lse        *tensor.Tensor
	dq, dk, dv    *tensor.Tensor
}

func newWhole(t *testing.T, s, b, h, e, f int, causal bool) *whole {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(s), uint64(h)))
	draw := func(w int) *tensor.Tensor {
		x := tensor.New(tensor.Float64, b, s, h, w)
		for i := range x.Float64() {
			x.Float64()[i] = float64(float32(2*rng.Float64() - 1))
		}
		return x
	}
	c := &whole{s: s, b: b, h: h, e: e, f: f, causal: causal, q: draw(e), k: draw(e), v: draw(f), do: draw(f)}
	k, err := providers.New("cpu", nil)
	if err != nil {
		t.Fatal(err)
	}
	c.o, c.lse = tensor.New(tensor.Float64, b, s, h, f), tensor.New(tensor.Float64, b, h, s)
	if err := k.Attention(c.o, c.lse, c.q, c.k, c.v, causal); err != nil {
		t.Fatal(err)
	}
	c.dq, c.dk, c.dv = tensor.New(tensor.Float64, b, s, h, e), tensor.New(tensor.Float64, b, s, h, e), tensor.New(tensor.Float64, b, s, h, f)
	if err := k.AttentionBackward(c.dq, c.dk, c.dv, c.do, c.q, c.k, c.v, c.o, c.lse, causal); err != nil {
		t.Fatal(err)
	}
	return c
}

// local is the rank's rows of x [B, S, H, w] at positions pos, float32.
func local(x *tensor.Tensor, pos []int) *tensor.Tensor {
	b, s, h, w := x.Dim(0), x.Dim(1), x.Dim(2), x.Dim(3)
	out := tensor.New(tensor.Float32, b, len(pos), h, w)
	for bi := range b {
		for i, p := range pos {
			for j := range h * w {
				out.Float32()[(bi*len(pos)+i)*h*w+j] = float32(x.Float64()[(bi*s+p)*h*w+j])
			}
		}
	}
	return out
}

// compare checks a rank's rows of got against want at pos: max |diff| over
// max |want| below tol.
func compare(got, want *tensor.Tensor, pos []int, lse bool) float64 {
	var d, m float64
	if lse {
		b, h, s := want.Dim(0), want.Dim(1), want.Dim(2)
		for bh := range b * h {
			for i, p := range pos {
				w := want.Float64()[bh*s+p]
				d, m = max(d, math.Abs(float64(got.Float32()[bh*len(pos)+i])-w)), max(m, math.Abs(w))
			}
		}
		return d / m
	}
	b, s, h, wd := want.Dim(0), want.Dim(1), want.Dim(2), want.Dim(3)
	for bi := range b {
		for i, p := range pos {
			for j := range h * wd {
				w := want.Float64()[(bi*s+p)*h*wd+j]
				d, m = max(d, math.Abs(float64(got.Float32()[(bi*len(pos)+i)*h*wd+j])-w)), max(m, math.Abs(w))
			}
		}
	}
	return d / m
}

type rankResult struct {
	errs                  map[string]float64
	fwdSent, sent, peakKV int64
	rows                  int
}

// runRing runs the case on cp in-process ranks.
func runRing(t *testing.T, c *whole, cp int, l ring.Layout) []rankResult {
	return runMode(t, c, cp, l, false)
}

// runMode runs the case as a ring, or gathering the keys and values.
func runMode(t *testing.T, c *whole, cp int, l ring.Layout, gather bool) []rankResult {
	t.Helper()
	out := make([]rankResult, cp)
	var mu sync.Mutex
	err := job.InProcess(context.Background(), cp, func(ctx context.Context, w *collective.World) error {
		k, err := providers.New("cpu", nil)
		if err != nil {
			return err
		}
		g, err := w.WorldGroup(ctx)
		if err != nil {
			return err
		}
		a, err := ring.New(ring.Config{Group: g, Kernels: k, Causal: c.causal, Layout: l, S: c.s, B: c.b, H: c.h, E: c.e, F: c.f, Rank: w.Rank(), Size: cp, Gather: gather})
		if err != nil {
			return err
		}
		pos := ring.Positions(a.Local())
		o, lse, err := a.Forward(ctx, local(c.q, pos), local(c.k, pos), local(c.v, pos))
		if err != nil {
			return err
		}
		fwdSent := a.Sent()
		dq, dk, dv, err := a.Backward(ctx, local(c.do, pos))
		if err != nil {
			return err
		}
		r := rankResult{errs: map[string]float64{
			"o": compare(o, c.o, pos, false), "lse": compare(lse, c.lse, pos, true),
			"dq": compare(dq, c.dq, pos, false), "dk": compare(dk, c.dk, pos, false), "dv": compare(dv, c.dv, pos, false),
		}, fwdSent: fwdSent, sent: a.Sent(), peakKV: a.PeakKV(), rows: len(pos)}
		mu.Lock()
		out[w.Rank()] = r
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRingMatchesWhole runs ring attention on 1 to 4 ranks, causal and
// not, contiguous and zigzag, at lengths no split divides, as a ring and
// gathering the keys and values, against the whole sequence's attention in
// float64: o, lse and the three gradients.
func TestRingMatchesWhole(t *testing.T) {
	for _, tc := range []struct {
		s, cp  int
		causal bool
		l      ring.Layout
	}{
		{13, 1, true, ring.Contiguous}, {13, 1, true, ring.Zigzag},
		{13, 2, true, ring.Contiguous}, {13, 2, true, ring.Zigzag}, {13, 2, false, ring.Contiguous},
		{23, 3, true, ring.Zigzag}, {23, 3, false, ring.Zigzag}, {22, 4, true, ring.Zigzag}, {9, 4, true, ring.Contiguous},
	} {
		for _, gather := range []bool{false, true} {
			t.Run(fmt.Sprintf("S=%d/cp=%d/causal=%v/%s/gather=%v", tc.s, tc.cp, tc.causal, tc.l, gather), func(t *testing.T) {
				c := newWhole(t, tc.s, 2, 3, 8, 6, tc.causal)
				for r, res := range runMode(t, c, tc.cp, tc.l, gather) {
					for name, e := range res.errs {
						if e > 2e-6 {
							t.Errorf("rank %d: %s relative error %.3g", r, name, e)
						}
					}
				}
			})
		}
	}
}

// TestRingMovesBlocks: each rank sends its keys and values cp−1 times
// forward and its keys, values and their gradients around once more
// backward, never the whole sequence at once, and holds at most two blocks.
func TestRingMovesBlocks(t *testing.T) {
	const s, b, h, e, f, cp = 40, 1, 2, 8, 8, 4
	c := newWhole(t, s, b, h, e, f, true)
	for r, res := range runRing(t, c, cp, ring.Zigzag) {
		block := int64(4 * b * res.rows * h * (e + f)) // this rank's K and V: S/cp rows
		if res.fwdSent != (cp-1)*block {
			t.Errorf("rank %d sent %d B forward, want (cp-1)·|K,V| = %d B ((cp-1)/cp of the whole sequence's)", r, res.fwdSent, (cp-1)*block)
		}
		// Backward: K, V and their gradients cp-1 times, the gradients home.
		if want := (cp-1)*block + (cp-1)*2*block + block; res.sent != want {
			t.Errorf("rank %d sent %d B in all, want %d B", r, res.sent, want)
		}
		if res.peakKV > 4*block {
			t.Errorf("rank %d held %d B of keys, values and their gradients at once, more than two blocks (%d B); the whole sequence's K and V are %d B",
				r, res.peakKV, 4*block, 4*b*s*h*(e+f))
		}
	}
}

// TestGatherHoldsTheSequence: the gather mode (what the planner picks at
// short contexts) holds every rank's keys and values, and their gradients,
// at once: the memory the ring saves.
func TestGatherHoldsTheSequence(t *testing.T) {
	const s, b, h, e, f, cp = 40, 1, 2, 8, 8, 4
	c := newWhole(t, s, b, h, e, f, true)
	whole := int64(4 * b * s * h * (e + f))
	for r, res := range runMode(t, c, cp, ring.Zigzag, true) {
		if res.peakKV != 2*whole {
			t.Errorf("rank %d held %d B of keys, values and gradients, want the whole sequence's twice, %d B", r, res.peakKV, 2*whole)
		}
		block := whole / cp
		if res.fwdSent != (cp-1)*block {
			t.Errorf("rank %d sent %d B forward, want %d B", r, res.fwdSent, (cp-1)*block)
		}
	}
}
