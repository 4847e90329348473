//go:build cuda

package cuda_test

import (
	"fmt"
	"math/rand"
	"os"
	"testing"
	"time"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cuda"
	"github.com/meshrun/meshrun/tensor"
)

// linearShapes are the seeds' linear layers: tokens × in × out.
var linearShapes = [][3]int{{1, 4096, 4096}, {8, 4096, 4096}, {512, 4096, 4096}, {2048, 4096, 4096}, {4096, 4096, 4096}, {8192, 4096, 4096}, {4096, 1024, 4096}}

func randomOn(b *testing.B, p *cuda.Provider, dt tensor.DType, shape ...int) *tensor.Tensor {
	n := tensor.NumElements(shape)
	x := make([]float32, n)
	for i := range x {
		x[i] = rand.Float32()*2 - 1
	}
	h, _ := tensor.FromFloat32(x, shape...)
	h, err := tensor.Convert(h, dt)
	if err != nil {
		b.Fatal(err)
	}
	d, err := tensor.Upload(p.Memory(), h)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkLinear: a linear layer's forward (y = x·Wᵀ + b, the bias fused)
// and backward (dx = dy·W; dW = dyᵀ·x with db fused, BGRADB) on the GPU, in
// TFLOP/s (2·M·N·K forward, 4·M·N·K backward), float32 (TF32 off unless
// MESHRUN_TF32=1) and bfloat16. bench/gpu/run.sh runs it beside PyTorch.
func BenchmarkLinear(b *testing.B) {
	p, err := cuda.New(0, cuda.OptionsFrom(os.Getenv))
	if err != nil {
		b.Skipf("no CUDA device: %v", err)
	}
	defer p.Close()
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		for _, s := range linearShapes {
			m, k, n := s[0], s[1], s[2]
			x, w, bias := randomOn(b, p, dt, m, k), randomOn(b, p, dt, n, k), randomOn(b, p, dt, n)
			y, dy := randomOn(b, p, dt, m, n), randomOn(b, p, dt, m, n)
			dx, dw, db := randomOn(b, p, dt, m, k), randomOn(b, p, dt, n, k), randomOn(b, p, dt, n)
			fwd := kernels.GemmParams{M: m, N: n, K: k, TransB: true, Alpha: 1, DType: dt, Epilogue: kernels.EpilogueBias}.Normalized()
			bx := kernels.GemmParams{M: m, N: k, K: n, Alpha: 1, DType: dt}.Normalized()
			bw := kernels.GemmParams{M: n, N: k, K: m, TransA: true, Alpha: 1, DType: dt, Epilogue: kernels.EpilogueBGrad}.Normalized()
			ops := map[string]func() error{
				"forward": func() error { return p.Gemm(fwd, kernels.GemmOperands{A: x, B: w, C: y, Bias: bias}) },
				"backward": func() error {
					if err := p.Gemm(bx, kernels.GemmOperands{A: dy, B: w, C: dx}); err != nil {
						return err
					}
					return p.Gemm(bw, kernels.GemmOperands{A: dy, B: x, C: dw, Bias: db})
				},
			}
			for _, op := range []string{"forward", "backward"} {
				flops := 2.0 * float64(m*n*k)
				if op == "backward" {
					flops *= 2
				}
				b.Run(fmt.Sprintf("%v/%dx%dx%d/%s", dt, m, k, n, op), func(b *testing.B) {
					run := ops[op]
					if err := run(); err != nil { // warm-up: the heuristic's pick, the module
						b.Fatal(err)
					}
					p.Synchronize()
					b.ResetTimer()
					start := time.Now()
					for range b.N {
						if err := run(); err != nil {
							b.Fatal(err)
						}
					}
					if err := p.Synchronize(); err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(flops*float64(b.N)/time.Since(start).Seconds()/1e12, "TFLOP/s")
				})
			}
		}
	}
}
