package linear

import (
	"time"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// Timed wraps kernels and reports the wall time of each op the layers call.
type Timed struct {
	kernels.Kernels
	Observe func(op string, d time.Duration)
}

func (t Timed) time(op string, start time.Time) { t.Observe(op, time.Since(start)) }

func (t Timed) LinearForward(y, x, w, b *tensor.Tensor) error {
	defer t.time("linear_forward", time.Now())
	return t.Kernels.LinearForward(y, x, w, b)
}

func (t Timed) LinearBackwardInput(dx, dy, w *tensor.Tensor) error {
	defer t.time("linear_backward_input", time.Now())
	return t.Kernels.LinearBackwardInput(dx, dy, w)
}

func (t Timed) LinearBackwardWeight(dw, dy, x *tensor.Tensor, acc bool) error {
	defer t.time("linear_backward_weight", time.Now())
	return t.Kernels.LinearBackwardWeight(dw, dy, x, acc)
}

func (t Timed) LinearBackwardBias(db, dy *tensor.Tensor, acc bool) error {
	defer t.time("linear_backward_bias", time.Now())
	return t.Kernels.LinearBackwardBias(db, dy, acc)
}

func (t Timed) GeluForward(y, x *tensor.Tensor) error {
	defer t.time("gelu_forward", time.Now())
	return t.Kernels.GeluForward(y, x)
}

func (t Timed) GeluBackward(dx, dy, x *tensor.Tensor) error {
	defer t.time("gelu_backward", time.Now())
	return t.Kernels.GeluBackward(dx, dy, x)
}
