package kernels_test

import (
	"math"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/kerneltest"
)

// TestGeluMatchesPyTorch: kernels.Gelu and kernels.GeluGrad, the float64
// references of every provider and the cpu provider's own float64 GELU,
// against PyTorch's gelu(approximate="tanh") and its autograd in float64
// (kerneltest/testdata/torch_ref.py), at 283 points over [-32, 32]. Each
// value is a sum of terms whose tanh may differ from PyTorch's by an ulp:
// within 1e-15 of the magnitude of those terms (|x| for the forward, 1 +
// 0.5·|x|·√(2/π)·(1 + 3·0.044715·x²) for the derivative), which is 1e-15
// relative wherever the result is not a cancellation (x > -1).
func TestGeluMatchesPyTorch(t *testing.T) {
	g := kerneltest.Torch().Gelu
	if len(g.X) < 200 || len(g.Y) != len(g.X) || len(g.DYDX) != len(g.X) {
		t.Fatalf("table: %d points, %d values, %d derivatives", len(g.X), len(g.Y), len(g.DYDX))
	}
	const rel = 1e-15
	var worstF, worstG float64 // error / magnitude
	for i, x := range g.X {
		y, d := kernels.Gelu(x), kernels.GeluGrad(x)
		magF := max(math.Abs(g.Y[i]), math.Abs(x))
		magG := 1 + 0.5*math.Abs(x)*kernels.GeluSqrt2OverPi*(1+3*kernels.GeluCoeff*x*x)
		ef, eg := math.Abs(y-g.Y[i]), math.Abs(d-g.DYDX[i])
		if !(ef <= rel*magF) { // NaN fails too
			t.Errorf("Gelu(%v) = %.17g, PyTorch %.17g (error %.3g, allowed %.3g)", x, y, g.Y[i], ef, rel*magF)
		}
		if !(eg <= rel*magG) {
			t.Errorf("GeluGrad(%v) = %.17g, PyTorch %.17g (error %.3g, allowed %.3g)", x, d, g.DYDX[i], eg, rel*magG)
		}
		if x > -1 && x != 0 {
			worstF = max(worstF, ef/math.Abs(g.Y[i]))
		}
		worstG = max(worstG, eg/magG)
	}
	t.Logf("PyTorch %s: forward within %.2g relative for x > -1, derivative within %.2g of its terms", kerneltest.Torch().Torch, worstF, worstG)
}

// TestGeluGradFiniteDifferences: GeluGrad is the derivative of Gelu, by
// central differences over [-10, 10], within their truncation and rounding
// error (2.5e-11 measured, relative to max(1, |x|); 1e-8 allowed).
func TestGeluGradFiniteDifferences(t *testing.T) {
	worst := 0.0
	for i := -1000; i <= 1000; i++ {
		x := float64(i)/100 + 0.003
		h := 1e-5 * max(1, math.Abs(x))
		fd := (kernels.Gelu(x+h) - kernels.Gelu(x-h)) / (2 * h)
		d := kernels.GeluGrad(x)
		e := math.Abs(d-fd) / max(1, math.Abs(x))
		if !(e <= 1e-8) {
			t.Fatalf("GeluGrad(%v) = %.12g, central difference of Gelu %.12g", x, d, fd)
		}
		worst = max(worst, e)
	}
	t.Logf("within %.2g", worst)
}
