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
