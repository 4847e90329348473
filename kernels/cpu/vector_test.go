package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// TestColumnSumExact: columnSum's float32 sum (AVX-512 where the machine
// has it) is the scalar loop's bit for bit, adding to db or not, for row
// counts around its four-row groups, column counts around its 16-column
// chunks and rows wider than the sum (ld > n), on values of every
// magnitude and sign.
func TestColumnSumExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, m := range []int{0, 1, 3, 4, 5, 8, 13, 64} {
		for _, n := range []int{0, 1, 15, 16, 17, 31, 48, 100, 130} {
			for _, extra := range []int{0, 3} {
				for _, acc := range []bool{false, true} {
					t.Run(fmt.Sprintf("%dx%d/ld+%d/acc=%v", m, n, extra, acc), func(t *testing.T) {
						ld := n + extra
						a := make([]float32, m*ld+1)
						for i := range a {
							a[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(9)-4)))
						}
						a[len(a)-1] = float32(math.NaN()) // past the last row: never read
						start := make([]float32, n+1)
						for j := range start {
							start[j] = float32(rng.NormFloat64())
						}
						want := append([]float32(nil), start...)
						if !acc {
							clear(want[:n])
						}
						for i := 0; i < m; i++ {
							for j := 0; j < n; j++ {
								want[j] += a[i*ld+j]
							}
						}
						got := append([]float32(nil), start...)
						columnSum(got, a[:len(a)-1], m, n, ld, acc)
						for j := range got {
							if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
								t.Fatalf("db[%d] = %v, want %v (the scalar loop's)", j, got[j], want[j])
							}
						}
					})
				}
			}
		}
	}
}

// TestAdamWAxpyExact: AdamW's and Axpy's float32 loops (AVX-512 where the
// machine has it) give the scalar loops' results bit for bit, for lengths
// around their 16-element blocks and 64-element rounds, split over threads
// or not.
func TestAdamWAxpyExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	vec := func(n int, pos bool) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(7)-3)))
			if pos {
				x[i] = float32(math.Abs(float64(x[i])))
			}
		}
		return x
	}
	same := func(t *testing.T, what string, got, want []float32) {
		t.Helper()
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s[%d] = %v, want %v (the scalar loop's)", what, i, got[i], want[i])
			}
		}
	}
	for _, threads := range []int{1, 2} {
		p, err := New(Options{Threads: threads})
		if err != nil {
			t.Fatal(err)
		}
		ten := func(x []float32) *tensor.Tensor {
			tt, err := tensor.FromFloat32(x, len(x))
			if err != nil {
				t.Fatal(err)
			}
			return tt
		}
		for _, n := range []int{1, 15, 16, 17, 63, 64, 65, 200, 4099} {
			t.Run(fmt.Sprintf("threads=%d/n=%d", threads, n), func(t *testing.T) {
				a := kernels.AdamWParams{LR: 3e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 7}
				param, grad, m, v := vec(n, false), vec(n, false), vec(n, false), vec(n, true)
				wp, wm, wv := append([]float32(nil), param...), append([]float32(nil), m...), append([]float32(nil), v...)
				k := a.Scalars()
				for i := range wp {
					g := grad[i]
					wm[i] = wm[i] + float32(k.W1*(g-wm[i]))
					wv[i] = float32(k.B2*wv[i]) + float32((1-k.B2)*g*g)
					wp[i] *= k.Decay
					wp[i] -= float32(k.Step*wm[i]) / (float32(math.Sqrt(float64(wv[i])))/k.Root + k.Eps)
				}
				tp, tm, tv := ten(param), ten(m), ten(v)
				if err := p.AdamW(a, tp, ten(grad), tm, tv); err != nil {
					t.Fatal(err)
				}
				same(t, "m", tm.Float32(), wm)
				same(t, "v", tv.Float32(), wv)
				same(t, "param", tp.Float32(), wp)

				x, y := vec(n, false), vec(n, false)
				want := append([]float32(nil), y...)
				const alpha = float32(-0.37)
				for i := range want {
					want[i] += float32(alpha * x[i])
				}
				ty := ten(y)
				if err := p.Axpy(float64(alpha), ten(x), ty); err != nil {
					t.Fatal(err)
				}
				same(t, "y", ty.Float32(), want)
			})
		}
	}
}

// TestExpShiftExact: the attention's vector exponentials give math.Exp's
// results bit for bit, rounded to float32 or not, over lengths around their
// blocks of 8, on scores of every size (down to underflow and past
// overflow, infinities and NaN, which leave the vector loop for math.Exp).
func TestExpShiftExact(t *testing.T) {
	if expShift32 == nil {
		t.Skip("no vector exponentials on this machine (the scalar loops are math.Exp)")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	special := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 800, -800, -745, -740, 709, 710, 0, float32(math.Copysign(0, -1)), 1e-30}
	for _, n := range []int{1, 7, 8, 9, 16, 33, 64, 1000} {
		for _, shift := range []float64{0, 3.25, -2, 1e3} {
			for _, withSpecial := range []bool{false, true} {
				src := make([]float32, n)
				for i := range src {
					src[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(4)-1)))
					if withSpecial && rng.IntN(5) == 0 {
						src[i] = special[rng.IntN(len(special))]
					}
				}
				d32, d64 := make([]float32, n), make([]float64, n)
				expShift32(d32, src, shift)
				expShift64(d64, src, shift)
				for i, x := range src {
					w := math.Exp(float64(x) - shift)
					if math.Float64bits(d64[i]) != math.Float64bits(w) && !(math.IsNaN(w) && math.IsNaN(d64[i])) {
						t.Fatalf("n=%d shift=%v: exp(%v − shift) = %v, math.Exp %v", n, shift, x, d64[i], w)
					}
					if math.Float32bits(d32[i]) != math.Float32bits(float32(w)) && !(math.IsNaN(w) && math.IsNaN(float64(d32[i]))) {
						t.Fatalf("n=%d shift=%v: float32 exp(%v − shift) = %v, math.Exp %v", n, shift, x, d32[i], float32(w))
					}
				}
				inPlace := append([]float32(nil), src...)
				expShift32(inPlace, inPlace, shift)
				for i := range inPlace {
					if math.Float32bits(inPlace[i]) != math.Float32bits(d32[i]) {
						t.Fatalf("in place: [%d] = %v, want %v", i, inPlace[i], d32[i])
					}
				}
			}
		}
	}
	// Many random arguments over the whole plain range.
	src := make([]float32, 1<<16)
	for i := range src {
		src[i] = float32((rng.Float64()*2 - 1) * 700)
	}
	d := make([]float64, len(src))
	expShift64(d, src, 0.5)
	for i, x := range src {
		if w := math.Exp(float64(x) - 0.5); math.Float64bits(d[i]) != math.Float64bits(w) {
			t.Fatalf("exp(%v − 0.5) = %v, math.Exp %v", x, d[i], w)
		}
	}
}

// TestVectorPathsExact: the ops built on the vector loops (attention
// forward and backward, cross-entropy and its backward, AdamW, Axpy,
// BiasGrad) give, with them, what they give with the scalar loops, bit for
// bit: the loops are swapped out, the ops run again, the outputs compared.
func TestVectorPathsExact(t *testing.T) {
	if expShift32 == nil && adamw32 == nil && colSum32 == nil {
		t.Skip("no vector loops on this machine")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	rnd := func(shape ...int) *tensor.Tensor {
		x := tensor.New(tensor.Float32, shape...)
		for i := range x.Float32() {
			x.Float32()[i] = float32(rng.NormFloat64())
		}
		return x
	}
	const b, s, h, e, v = 2, 37, 3, 16, 23
	qkv, do := rnd(b, s, h, 3, e), rnd(b, s, h, e)
	logits, targets := rnd(b*s, v), tensor.New(tensor.Float32, b*s)
	for i := range targets.Float32() {
		targets.Float32()[i] = float32(rng.IntN(v))
	}
	param, grad, m, vel := rnd(1000), rnd(1000), rnd(1000), rnd(1000)
	for i, x := range vel.Float32() {
		vel.Float32()[i] = x * x
	}
	dy, clse := rnd(b*s, 45), rnd(b*s)
	run := func() []*tensor.Tensor {
		p, err := New(Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		o, lse, dqkv := tensor.New(tensor.Float32, b, s, h, e), tensor.New(tensor.Float32, b, h, s), tensor.New(tensor.Float32, b, s, h, 3, e)
		stats, dl := tensor.New(tensor.Float32, b*s, 3), tensor.New(tensor.Float32, b*s, v)
		clone := func(x *tensor.Tensor) *tensor.Tensor {
			c, err := x.Clone()
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		pp, mm, vv, y, db := clone(param), clone(m), clone(vel), clone(dy), tensor.New(tensor.Float32, 45)
		for _, err := range []error{
			p.Attention(o, lse, qkv, nil, nil, true),
			p.AttentionBackward(dqkv, nil, nil, do, qkv, nil, nil, o, lse, true),
			p.CrossEntropy(stats, logits, targets, 0),
			p.CrossEntropyBackward(dl, logits, targets, clse, 0, 0.01),
			p.AdamW(kernels.AdamWParams{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 2}, pp, grad, mm, vv),
			p.Axpy(0.3, dy, y),
			p.BiasGrad(db, dy, false),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
		return []*tensor.Tensor{o, lse, dqkv, stats, dl, pp, mm, vv, y, db}
	}
	vector := run()
	e32, e64, a32, s32, c32 := expShift32, expShift64, adamw32, addScaled32, colSum32
	expShift32, expShift64, adamw32, addScaled32, colSum32 = nil, nil, nil, nil, nil
	scalar := run()
	expShift32, expShift64, adamw32, addScaled32, colSum32 = e32, e64, a32, s32, c32
	names := []string{"attention o", "attention lse", "attention dqkv", "cross-entropy stats", "cross-entropy dlogits", "AdamW param", "AdamW m", "AdamW v", "Axpy y", "BiasGrad db"}
	for k, name := range names {
		for i, x := range vector[k].Float32() {
			if w := scalar[k].Float32()[i]; math.Float32bits(x) != math.Float32bits(w) {
				t.Errorf("%s[%d] = %v with the vector loops, %v with the scalar ones", name, i, x, w)
				break
			}
		}
	}
}

// TestLayerNormVectorExact: layer norm's float32 vector loops give the
// scalar loops' output and statistics, and in the backward the input,
// gamma and beta gradients (added to what is there, or not), bit for bit,
// with and without beta, for widths around their blocks and row counts
// around their groups of four.
func TestLayerNormVectorExact(t *testing.T) {
	if lnForward32 == nil || lnDx32 == nil || lnColumns32 == nil {
		t.Skip("no vector layer norm on this machine")
	}
	rng := rand.New(rand.NewPCG(9, 10))
	rnd := func(n int, scale, offset float64) *tensor.Tensor {
		x := tensor.New(tensor.Float32, n)
		for i := range x.Float32() {
			x.Float32()[i] = float32(offset + scale*rng.NormFloat64())
		}
		return x
	}
	p, err := New(Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []int{16, 17, 19, 31, 64, 100, 128, 130} {
		for _, rows := range []int{1, 3, 4, 5, 9} {
			for _, withBeta := range []bool{false, true} {
				x, gamma := rnd(rows*d, 3, 1.5), rnd(d, 1, 1)
				var beta *tensor.Tensor
				if withBeta {
					beta = rnd(d, 0.5, 0)
				}
				x2, err := x.Reshape(rows, d)
				if err != nil {
					t.Fatal(err)
				}
				run := func() (*tensor.Tensor, *tensor.Tensor) {
					y, stats := tensor.New(tensor.Float32, rows, d), tensor.New(tensor.Float32, rows, 2)
					if err := p.LayerNorm(y, stats, x2, gamma, beta, 1e-5); err != nil {
						t.Fatal(err)
					}
					return y, stats
				}
				dy := rnd(rows*d, 1, 0)
				dy2, err := dy.Reshape(rows, d)
				if err != nil {
					t.Fatal(err)
				}
				start := rnd(d, 1, 0)
				backward := func(stats *tensor.Tensor) (dx, dgamma, dbeta *tensor.Tensor) {
					dx, dgamma, dbeta = tensor.New(tensor.Float32, rows, d), tensor.New(tensor.Float32, d), tensor.New(tensor.Float32, d)
					copy(dgamma.Float32(), start.Float32())
					copy(dbeta.Float32(), start.Float32())
					if err := p.LayerNormBackward(dx, dgamma, dbeta, dy2, x2, gamma, stats, withBeta); err != nil {
						t.Fatal(err)
					}
					return dx, dgamma, dbeta
				}
				vy, vs := run()
				vdx, vdg, vdb := backward(vs)
				keep, keepDx, keepCols := lnForward32, lnDx32, lnColumns32
				lnForward32, lnDx32, lnColumns32 = nil, nil, nil
				sy, ss := run()
				sdx, sdg, sdb := backward(ss)
				lnForward32, lnDx32, lnColumns32 = keep, keepDx, keepCols
				for _, c := range []struct {
					name   string
					vec, s []float32
				}{{"y", vy.Float32(), sy.Float32()}, {"stats", vs.Float32(), ss.Float32()},
					{"dx", vdx.Float32(), sdx.Float32()}, {"dgamma", vdg.Float32(), sdg.Float32()}, {"dbeta", vdb.Float32(), sdb.Float32()}} {
					for i := range c.s {
						if math.Float32bits(c.vec[i]) != math.Float32bits(c.s[i]) {
							t.Fatalf("d=%d rows=%d beta=%v: %s[%d] = %v with the vector loops, %v with the scalar ones", d, rows, withBeta, c.name, i, c.vec[i], c.s[i])
						}
					}
				}
			}
		}
	}
}
