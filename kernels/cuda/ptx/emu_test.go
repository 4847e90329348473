//go:build cudaemu

package ptx

import (
	"math"
	"math/rand"
	"testing"

	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/tensor"
)

func random(dt tensor.DType, n int, rng *rand.Rand) *tensor.Tensor {
	x := make([]float64, n)
	for i := range x {
		x[i] = rng.NormFloat64() * 3
	}
	t, _ := tensor.FromFloat64(x, n)
	out := tensor.New(dt, n)
	cpuP(nil).Cast(out, t)
	return out
}

func wide(x *tensor.Tensor) *tensor.Tensor {
	w := tensor.New(tensor.Float64, x.Len())
	cpuP(nil).Cast(w, x)
	return w
}

var provider *cpu.Provider

func cpuP(t *testing.T) *cpu.Provider {
	if provider == nil {
		p, err := cpu.New(cpu.Options{})
		if err != nil {
			panic(err)
		}
		provider = p
	}
	return provider
}

// near: a and b agree to dt's precision, relative to values of order 1.
func near(dt tensor.DType, a, b float64) bool {
	tol := map[tensor.DType]float64{tensor.Float32: 1e-6, tensor.Float64: 1e-14, tensor.BFloat16: tensor.BF16Epsilon}[dt]
	return math.Abs(a-b) <= tol*math.Max(1, math.Abs(b))
}

func compare(t *testing.T, what string, got, want *tensor.Tensor) {
	t.Helper()
	for i := range got.Len() {
		if g, w := got.At(i), want.At(i); !near(got.DType(), g, w) {
			t.Fatalf("%s %v [%d of %d]: %g, cpu provider %g", what, got.DType(), i, got.Len(), g, w)
		}
	}
}

// TestKernelsMatchCPU: every kernel of kernels.h, run on the CPU with an odd
// thread count (so that grid-stride loops wrap) and at the provider's own,
// against the cpu provider: GELU forward and backward, the mean squared error
// with its gradient and fixed-order sum, the bfloat16 axpy and the casts, at
// sizes 0, 1, odd and larger than the grid.
func TestKernelsMatchCPU(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	p := cpuP(t)
	for _, n := range []int{0, 1, 37, 1000, 70001} {
		for _, threads := range []int{7, BlockThreads * 3} {
			for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64, tensor.BFloat16} {
				x, dy, tg := random(dt, n, rng), random(dt, n, rng), random(dt, n, rng)
				got, want := tensor.New(dt, n), tensor.New(dt, n)
				// GELU against the float64 kernels on the same (widened)
				// inputs: the kernels compute in float64 and round once,
				// more exactly than the cpu provider's float32 tanh, whose
				// 1e-7 near ±1 becomes 1e-5 in the gradient at |x| ≈ 9.
				x64, dy64, want64 := wide(x), wide(dy), tensor.New(tensor.Float64, n)
				Gelu(got, nil, x, threads)
				p.GeluForward(want64, x64)
				compare(t, "gelu", got, want64)
				Gelu(got, dy, x, threads)
				p.GeluBackward(want64, dy64, x64)
				compare(t, "gelu_grad", got, want64)

				sum := tensor.New(tensor.Float64, 1)
				s := MSE(got, x, tg, 0.25, MSEThreads)
				p.MSE(want, sum, x, tg, 0.25)
				compare(t, "mse grad", got, want)
				if w := sum.Float64()[0]; math.Abs(s-w) > 1e-12*math.Max(1, w) {
					t.Fatalf("mse %v n=%d: sum %g, cpu provider %g", dt, n, s, w)
				}
			}
			x16, y16 := random(tensor.BFloat16, n, rng), random(tensor.BFloat16, n, rng)
			want, _ := y16.Clone()
			Axpy(-0.1, x16, y16, threads)
			p.Axpy(-0.1, x16, want)
			compare(t, "axpy", y16, want)

			for _, cols := range []int{1, 3, 100} {
				if n%cols != 0 {
					continue
				}
				dy := random(tensor.BFloat16, n, rng)
				for _, dbt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
					for _, accumulate := range []bool{false, true} {
						got, want := random(dbt, cols, rng), tensor.New(dbt, cols)
						p.Cast(want, got)
						dy2, _ := dy.Reshape(n/cols, cols)
						BiasGrad(got, dy2, n/cols, cols, accumulate, threads)
						p.BiasGrad(want, dy2, accumulate)
						for j := range cols { // float32 sums of up to 70001 terms, in another order
							if g, w := got.At(j), want.At(j); math.Abs(g-w) > 2e-5*math.Sqrt(float64(n)) && !near(dbt, g, w) {
								t.Fatalf("bias grad %v->%v %dx%d accumulate %v [%d]: %g, cpu provider %g", dy.DType(), dbt, n/cols, cols, accumulate, j, g, w)
							}
						}
					}
				}
			}

			f := random(tensor.Float32, n, rng)
			got16, want16 := tensor.New(tensor.BFloat16, n), tensor.New(tensor.BFloat16, n)
			Cast(got16, f, threads)
			p.Cast(want16, f)
			compare(t, "cast to bf16", got16, want16)
			got32, want32 := tensor.New(tensor.Float32, n), tensor.New(tensor.Float32, n)
			Cast(got32, want16, threads)
			p.Cast(want32, want16)
			compare(t, "cast to f32", got32, want32)
		}
	}
}
