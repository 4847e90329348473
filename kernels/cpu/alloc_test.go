package cpu_test

import (
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/tensor"
)

// TestNoAllocs checks that calls allocate nothing once their buffers are warm.
func TestNoAllocs(t *testing.T) {
	for _, name := range cpu.Kernels() {
		p, err := cpu.New(cpu.Options{Kernel: name, Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		m, k, n := 67, 300, 130
		x, w, b := tensor.New(tensor.Float32, m, k), tensor.New(tensor.Float32, n, k), tensor.New(tensor.Float32, n)
		y, dy := tensor.New(tensor.Float32, m, n), tensor.New(tensor.Float32, m, n)
		dx, dw := tensor.New(tensor.Float32, m, k), tensor.New(tensor.Float32, n, k)
		x1, y1 := tensor.New(tensor.Float32, 1, k), tensor.New(tensor.Float32, 1, n)
		calls := map[string]func() error{
			"forward":         func() error { return kernels.LinearForward(p, y, x, w, b) },
			"backward_input":  func() error { return kernels.LinearBackwardInput(p, dx, dy, w) },
			"backward_weight": func() error { return kernels.LinearBackwardWeight(p, dw, dy, x, true) },
			"backward_bias":   func() error { return kernels.LinearBackwardBias(p, b, dy, true) },
			"gemv":            func() error { return kernels.LinearForward(p, y1, x1, w, b) },
			"gelu":            func() error { return p.GeluForward(y, y) },
			"dgemm": func() error {
				return p.Dgemm(kernels.GemmParams{M: 40, N: 50, K: 60, Alpha: 1}, make64[:2400], make64[:3000], make64[:2000])
			},
		}
		for op, call := range calls {
			for i := 0; i < 3; i++ {
				if err := call(); err != nil {
					t.Fatal(err)
				}
			}
			if a := testing.AllocsPerRun(10, func() { _ = call() }); a != 0 {
				t.Errorf("%s/%s: %v allocations per call", name, op, a)
			}
		}
	}
}

var make64 = make([]float64, 3000)

// TestNoAllocsBF16 is TestNoAllocs for the bfloat16 ops, on every bfloat16 path.
func TestNoAllocsBF16(t *testing.T) {
	bf := tensor.BFloat16
	for _, name := range cpu.BF16Kernels() {
		p, err := cpu.New(cpu.Options{BF16: name, Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		m, k, n := 67, 300, 130
		x, w, b := tensor.New(bf, m, k), tensor.New(bf, n, k), tensor.New(bf, n)
		y, aux, dy := tensor.New(bf, m, n), tensor.New(bf, m, n), tensor.New(bf, m, n)
		dx, dw32, db32 := tensor.New(bf, m, k), tensor.New(tensor.Float32, n, k), tensor.New(tensor.Float32, n)
		x1, y1, dx1 := tensor.New(bf, 1, k), tensor.New(bf, 1, n), tensor.New(bf, 1, k)
		x8, y8, dx8 := tensor.New(bf, 8, k), tensor.New(bf, 8, n), tensor.New(bf, 8, k)
		xf := tensor.New(tensor.Float32, m, k)
		sum := tensor.New(tensor.Float64, 1)
		calls := map[string]func() error{
			"forward":         func() error { return kernels.LinearForward(p, y, x, w, b) },
			"forward_gelu":    func() error { return kernels.LinearForwardGelu(p, y, aux, x, w, b) },
			"backward_input":  func() error { return kernels.LinearBackwardInput(p, dx, dy, w) },
			"backward_gelu":   func() error { return kernels.LinearBackwardInputGelu(p, dx, nil, dy, w, dx) },
			"backward_weight": func() error { return kernels.LinearBackwardWeightBias(p, dw32, db32, dy, x, true) },
			"backward_bias":   func() error { return kernels.LinearBackwardBias(p, b, dy, true) },
			"gemv":            func() error { return kernels.LinearForward(p, y1, x1, w, b) },
			"gemv_input":      func() error { return kernels.LinearBackwardInput(p, dx1, y1, w) },
			"small_m":         func() error { return kernels.LinearForward(p, y8, x8, w, b) },
			"small_m_input":   func() error { return kernels.LinearBackwardInput(p, dx8, y8, w) },
			"gelu":            func() error { return p.GeluForward(y, dy) },
			"gelu_backward":   func() error { return p.GeluBackward(y, dy, aux) },
			"axpy":            func() error { return p.Axpy(-0.1, dy, y) },
			"mse":             func() error { return p.MSE(aux, sum, y, dy, 0.5) },
			"cast":            func() error { return p.Cast(xf, x) },
		}
		for op, call := range calls {
			for i := 0; i < 3; i++ {
				if err := call(); err != nil {
					t.Fatalf("%s/%s: %v", name, op, err)
				}
			}
			if a := testing.AllocsPerRun(10, func() { _ = call() }); a != 0 {
				t.Errorf("%s/%s: %v allocations per call", name, op, a)
			}
		}
	}
}
