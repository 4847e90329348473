package cpu_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/tensor"
)

func randTensor(dt tensor.DType, shape ...int) *tensor.Tensor {
	t := tensor.New(dt, shape...)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < t.Len(); i++ {
		if dt == tensor.Float32 {
			t.Float32()[i] = rng.Float32()*2 - 1
		} else {
			t.Float64()[i] = rng.Float64()*2 - 1
		}
	}
	return t
}

func report(b *testing.B, flops float64) {
	b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// linearShapes are (M, K, N) of y[M,N] = x[M,K]·w[N,K]ᵀ.
var linearShapes = [][3]int{{1, 4096, 4096}, {8, 4096, 4096}, {512, 1024, 4096}, {2048, 1024, 4096}, {4096, 4096, 1024}}

func provider(b *testing.B) *cpu.Provider {
	p, err := cpu.New(cpu.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

func BenchmarkSgemm(b *testing.B) {
	p := provider(b)
	for _, n := range []int{256, 1024, 2048} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			x, y, z := randTensor(tensor.Float32, n, n), randTensor(tensor.Float32, n, n), tensor.New(tensor.Float32, n, n)
			g := kernels.GemmParams{M: n, N: n, K: n, Alpha: 1, DType: tensor.Float32}
			b.ReportAllocs()
			for b.Loop() {
				if err := p.Gemm(g, kernels.GemmOperands{A: x, B: y, C: z}); err != nil {
					b.Fatal(err)
				}
			}
			report(b, g.Flops())
		})
	}
}

func BenchmarkDgemm(b *testing.B) {
	p := provider(b)
	n := 512
	x, y, z := randTensor(tensor.Float64, n, n), randTensor(tensor.Float64, n, n), tensor.New(tensor.Float64, n, n)
	g := kernels.GemmParams{M: n, N: n, K: n, Alpha: 1, DType: tensor.Float64}
	for b.Loop() {
		if err := p.Gemm(g, kernels.GemmOperands{A: x, B: y, C: z}); err != nil {
			b.Fatal(err)
		}
	}
	report(b, g.Flops())
}

func BenchmarkLinear(b *testing.B) {
	p := provider(b)
	for _, s := range linearShapes {
		m, k, n := s[0], s[1], s[2]
		x, w, bias := randTensor(tensor.Float32, m, k), randTensor(tensor.Float32, n, k), randTensor(tensor.Float32, n)
		y, dy := tensor.New(tensor.Float32, m, n), randTensor(tensor.Float32, m, n)
		dx, dw, db := tensor.New(tensor.Float32, m, k), tensor.New(tensor.Float32, n, k), tensor.New(tensor.Float32, n)
		flops := 2 * float64(m) * float64(n) * float64(k)
		name := fmt.Sprintf("M%d_K%d_N%d", m, k, n)
		b.Run(name+"/forward", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := kernels.LinearForward(p, y, x, w, bias); err != nil {
					b.Fatal(err)
				}
			}
			report(b, flops)
		})
		b.Run(name+"/backward_input", func(b *testing.B) {
			for b.Loop() {
				if err := kernels.LinearBackwardInput(p, dx, dy, w); err != nil {
					b.Fatal(err)
				}
			}
			report(b, flops)
		})
		b.Run(name+"/backward_weight", func(b *testing.B) {
			for b.Loop() {
				if err := kernels.LinearBackwardWeight(p, dw, dy, x, false); err != nil {
					b.Fatal(err)
				}
			}
			report(b, flops)
		})
		b.Run(name+"/backward_bias", func(b *testing.B) {
			for b.Loop() {
				if err := kernels.LinearBackwardBias(p, db, dy, false); err != nil {
					b.Fatal(err)
				}
			}
			report(b, float64(m*n))
		})
	}
}

func BenchmarkGemv(b *testing.B) {
	p := provider(b)
	n := 4096
	a, x, y := randTensor(tensor.Float32, n, n), randTensor(tensor.Float32, n), tensor.New(tensor.Float32, n)
	for _, trans := range []bool{false, true} {
		b.Run(fmt.Sprintf("trans=%v", trans), func(b *testing.B) {
			g := kernels.GemvParams{Trans: trans, M: n, N: n, Alpha: 1, DType: tensor.Float32}
			for b.Loop() {
				if err := p.Gemv(g, a, x, y); err != nil {
					b.Fatal(err)
				}
			}
			report(b, 2*float64(n*n))
		})
	}
}

func BenchmarkMatmul(b *testing.B) {
	p := provider(b)
	B, m, n, k := 16, 128, 128, 256
	a, bb, c := randTensor(tensor.Float32, B, m, k), randTensor(tensor.Float32, B, k, n), tensor.New(tensor.Float32, B, m, n)
	dc, da, db := randTensor(tensor.Float32, B, m, n), tensor.New(tensor.Float32, B, m, k), tensor.New(tensor.Float32, B, k, n)
	flops := 2 * float64(B*m*n*k)
	b.Run("forward", func(b *testing.B) {
		for b.Loop() {
			_ = kernels.MatmulForward(p, c, a, bb)
		}
		report(b, flops)
	})
	b.Run("backward_input", func(b *testing.B) {
		for b.Loop() {
			_ = kernels.MatmulBackwardInput(p, da, dc, bb, false)
		}
		report(b, flops)
	})
	b.Run("backward_other", func(b *testing.B) {
		for b.Loop() {
			_ = kernels.MatmulBackwardOther(p, db, dc, a, false)
		}
		report(b, flops)
	})
}

func BenchmarkGelu(b *testing.B) {
	p := provider(b)
	n := 1 << 20
	x, dy, y := randTensor(tensor.Float32, n), randTensor(tensor.Float32, n), tensor.New(tensor.Float32, n)
	// GFLOP/s here counts one "flop" per element, to compare runs.
	b.Run("forward", func(b *testing.B) {
		for b.Loop() {
			_ = p.GeluForward(y, x)
		}
		report(b, float64(n))
	})
	b.Run("backward", func(b *testing.B) {
		for b.Loop() {
			_ = p.GeluBackward(y, dy, x)
		}
		report(b, float64(n))
	})
}

func randBF16(shape ...int) *tensor.Tensor {
	t := tensor.New(tensor.BFloat16, shape...)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range t.BFloat16() {
		t.BFloat16()[i] = tensor.ToBF16(rng.Float32()*2 - 1)
	}
	return t
}

// BenchmarkLinearBF16 is BenchmarkLinear with bfloat16 operands and outputs,
// for every bfloat16 path.
func BenchmarkLinearBF16(b *testing.B) {
	for _, path := range cpu.BF16Kernels() {
		p, err := cpu.New(cpu.Options{BF16: path})
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range linearShapes {
			m, k, n := s[0], s[1], s[2]
			x, w, bias := randBF16(m, k), randBF16(n, k), randBF16(n)
			y, dy := tensor.New(tensor.BFloat16, m, n), randBF16(m, n)
			dx, dw := tensor.New(tensor.BFloat16, m, k), tensor.New(tensor.BFloat16, n, k)
			flops := 2 * float64(m) * float64(n) * float64(k)
			name := fmt.Sprintf("%s/M%d_K%d_N%d", path, m, k, n)
			b.Run(name+"/forward", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if err := kernels.LinearForward(p, y, x, w, bias); err != nil {
						b.Fatal(err)
					}
				}
				report(b, flops)
			})
			b.Run(name+"/backward_input", func(b *testing.B) {
				for b.Loop() {
					if err := kernels.LinearBackwardInput(p, dx, dy, w); err != nil {
						b.Fatal(err)
					}
				}
				report(b, flops)
			})
			b.Run(name+"/backward_weight", func(b *testing.B) {
				for b.Loop() {
					if err := kernels.LinearBackwardWeight(p, dw, dy, x, false); err != nil {
						b.Fatal(err)
					}
				}
				report(b, flops)
			})
		}
	}
}

// BenchmarkElementwise compares the elementwise ops on float32 and bfloat16
// (GFLOP/s counts one per element).
func BenchmarkElementwise(b *testing.B) {
	p := provider(b)
	m, n := 2048, 4096
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		rnd := func(shape ...int) *tensor.Tensor {
			if dt == tensor.BFloat16 {
				return randBF16(shape...)
			}
			return randTensor(dt, shape...)
		}
		x, dy, y := rnd(m, n), rnd(m, n), tensor.New(dt, m, n)
		db := tensor.New(tensor.Float32, n)
		sum := tensor.New(tensor.Float64, 1)
		other := tensor.New(tensor.Float32, m, n)
		if dt == tensor.Float32 {
			other = tensor.New(tensor.BFloat16, m, n)
		}
		if dt == tensor.Float32 {
			db = tensor.New(dt, n)
		}
		for _, c := range []struct {
			name string
			f    func() error
		}{
			{"gelu_forward", func() error { return p.GeluForward(y, x) }},
			{"gelu_backward", func() error { return p.GeluBackward(y, dy, x) }},
			{"bias_grad", func() error { return p.BiasGrad(db, dy, false) }},
			{"axpy", func() error { return p.Axpy(-0.1, x, y) }},
			{"mse", func() error { return p.MSE(y, sum, x, dy, 0.5) }},
			{"cast", func() error { return p.Cast(other, x) }},
		} {
			b.Run(fmt.Sprintf("%v/%s", dt, c.name), func(b *testing.B) {
				for b.Loop() {
					if err := c.f(); err != nil {
						b.Fatal(err)
					}
				}
				report(b, float64(m*n))
			})
		}
	}
}
