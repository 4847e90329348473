package linear

import (
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// Traced wraps kernels and reports each op the layers call: Trace is called when
// the op starts (cat "kernel") and the function it returns when it ends.
type Traced struct {
	kernels.Kernels
	Trace func(name, cat string) (end func())
}

func (t Traced) Gemm(p kernels.GemmParams, a, b, c *tensor.Tensor) error {
	defer t.Trace("gemm", "kernel")()
	return t.Kernels.Gemm(p, a, b, c)
}

func (t Traced) LinearForward(y, x, w, b *tensor.Tensor) error {
	defer t.Trace("linear_forward", "kernel")()
	return t.Kernels.LinearForward(y, x, w, b)
}

func (t Traced) LinearBackwardInput(dx, dy, w *tensor.Tensor) error {
	defer t.Trace("linear_backward_input", "kernel")()
	return t.Kernels.LinearBackwardInput(dx, dy, w)
}

func (t Traced) LinearBackwardWeight(dw, dy, x *tensor.Tensor, acc bool) error {
	defer t.Trace("linear_backward_weight", "kernel")()
	return t.Kernels.LinearBackwardWeight(dw, dy, x, acc)
}

func (t Traced) LinearBackwardBias(db, dy *tensor.Tensor, acc bool) error {
	defer t.Trace("linear_backward_bias", "kernel")()
	return t.Kernels.LinearBackwardBias(db, dy, acc)
}

func (t Traced) GeluForward(y, x *tensor.Tensor) error {
	defer t.Trace("gelu_forward", "kernel")()
	return t.Kernels.GeluForward(y, x)
}

func (t Traced) GeluBackward(dx, dy, x *tensor.Tensor) error {
	defer t.Trace("gelu_backward", "kernel")()
	return t.Kernels.GeluBackward(dx, dy, x)
}
