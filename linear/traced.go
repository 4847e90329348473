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

// DeviceMemory is the wrapped device's (kernels.DeviceMemory).
func (t traced) DeviceMemory() tensor.Memory { return kernels.DeviceMemory(t.Compute) }

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

func (t traced) GroupedGemm(p kernels.GroupedParams, o kernels.GemmOperands) error {
	defer t.Trace("grouped_gemm", "kernel")()
	return t.Compute.GroupedGemm(p, o)
}

func (t traced) Cast(dst, src *tensor.Tensor) error {
	defer t.Trace("cast", "kernel")()
	return t.Compute.Cast(dst, src)
}

func (t traced) LayerNorm(y, stats, x, gamma, beta *tensor.Tensor, eps float64) error {
	defer t.Trace("layer_norm", "kernel")()
	return t.Compute.LayerNorm(y, stats, x, gamma, beta, eps)
}

func (t traced) LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats *tensor.Tensor, acc bool) error {
	defer t.Trace("layer_norm_backward", "kernel")()
	return t.Compute.LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats, acc)
}

func (t traced) Attention(o, lse, q, k, v *tensor.Tensor, causal bool) error {
	defer t.Trace("attention", "kernel")()
	return t.Compute.Attention(o, lse, q, k, v, causal)
}

func (t traced) AttentionBackward(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool) error {
	defer t.Trace("attention_backward", "kernel")()
	return t.Compute.AttentionBackward(dq, dk, dv, do, q, k, v, o, lse, causal)
}

func (t traced) Embedding(y, ids, table *tensor.Tensor, offset int) error {
	defer t.Trace("embedding", "kernel")()
	return t.Compute.Embedding(y, ids, table, offset)
}

func (t traced) EmbeddingBackward(dtable, dy, ids *tensor.Tensor, offset int, acc bool) error {
	defer t.Trace("embedding_backward", "kernel")()
	return t.Compute.EmbeddingBackward(dtable, dy, ids, offset, acc)
}

func (t traced) CrossEntropy(stats, logits, targets *tensor.Tensor, offset int) error {
	defer t.Trace("cross_entropy", "kernel")()
	return t.Compute.CrossEntropy(stats, logits, targets, offset)
}

func (t traced) CrossEntropyBackward(dlogits, logits, targets, lse *tensor.Tensor, offset int, scale float64) error {
	defer t.Trace("cross_entropy_backward", "kernel")()
	return t.Compute.CrossEntropyBackward(dlogits, logits, targets, lse, offset, scale)
}

func (t traced) CrossEntropyCombine(lse, loss, stats *tensor.Tensor) error {
	defer t.Trace("cross_entropy_combine", "kernel")()
	return t.Compute.CrossEntropyCombine(lse, loss, stats)
}

func (t traced) AdamW(p kernels.AdamWParams, param, grad, m, v *tensor.Tensor) error {
	defer t.Trace("adamw", "kernel")()
	return t.Compute.AdamW(p, param, grad, m, v)
}
