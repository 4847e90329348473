package kernels

import "math"

// GELU uses the tanh approximation, as PyTorch's gelu(approximate="tanh"):
//
//	gelu(x)  = 0.5·x·(1 + tanh(u)),  u = √(2/π)·(x + 0.044715·x³)
//	gelu'(x) = 0.5·(1 + tanh(u)) + 0.5·x·(1 − tanh²(u))·√(2/π)·(1 + 3·0.044715·x²)
//
// These float64 functions are the reference every provider is tested against,
// and PyTorch's values are theirs (TestGeluMatchesPyTorch).
const (
	GeluSqrt2OverPi = 0.7978845608028654
	GeluCoeff       = 0.044715
)

// Gelu is the reference forward.
func Gelu(x float64) float64 {
	u := GeluSqrt2OverPi * (x + GeluCoeff*x*x*x)
	return 0.5 * x * (1 + math.Tanh(u))
}

// GeluGrad is the reference derivative.
func GeluGrad(x float64) float64 {
	u := GeluSqrt2OverPi * (x + GeluCoeff*x*x*x)
	t := math.Tanh(u)
	return 0.5*(1+t) + 0.5*x*(1-t*t)*GeluSqrt2OverPi*(1+3*GeluCoeff*x*x)
}
