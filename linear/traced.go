package linear

import (
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// Traced wraps a device and reports each kernel the layers call: trace is called
// when the op starts (cat "kernel", name the op: "gemm_bias", "gelu_forward"...)
// and the function it returns when it ends. Memory calls pass through untraced.
func Traced(k kernels.Compute, trace func(name, cat string) (end func())) kernels.Compute {
	return traced{k, trace}
}

type traced struct {
	kernels.Compute
	Trace func(name, cat string) (end func())
}

func (t traced) Gemm(p kernels.GemmParams, o kernels.GemmOperands) error {
	defer t.Trace(p.Epilogue.Op().String(), "kernel")()
	return t.Compute.Gemm(p, o)
}

func (t traced) Gemv(p kernels.GemvParams, a, x, y *tensor.Tensor) error {
	defer t.Trace("gemv", "kernel")()
	return t.Compute.Gemv(p, a, x, y)
}

func (t traced) GeluForward(y, x *tensor.Tensor) error {
	defer t.Trace("gelu_forward", "kernel")()
	return t.Compute.GeluForward(y, x)
}

func (t traced) GeluBackward(dx, dy, x *tensor.Tensor) error {
	defer t.Trace("gelu_backward", "kernel")()
	return t.Compute.GeluBackward(dx, dy, x)
}

func (t traced) BiasGrad(db, dy *tensor.Tensor, acc bool) error {
	defer t.Trace("bias_grad", "kernel")()
	return t.Compute.BiasGrad(db, dy, acc)
}

func (t traced) Axpy(alpha float64, x, y *tensor.Tensor) error {
	defer t.Trace("axpy", "kernel")()
	return t.Compute.Axpy(alpha, x, y)
}

func (t traced) MSE(dy, sum, y, target *tensor.Tensor, scale float64) error {
	defer t.Trace("mse", "kernel")()
	return t.Compute.MSE(dy, sum, y, target, scale)
}
