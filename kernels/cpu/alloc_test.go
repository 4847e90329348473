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
