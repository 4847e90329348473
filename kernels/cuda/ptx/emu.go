//go:build cudaemu

// The emulation: the kernels of kernels.h run on the CPU, one thread after
// another. The sums follow the provider's launch shapes (MSEThreads,
// SumThreads).

package ptx

/*
#cgo CXXFLAGS: -std=c++17 -O2
#include "emu.h"
*/
import "C"

import (
	"unsafe"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

func ptr[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

func code(dt tensor.DType) C.int {
	switch dt {
	case tensor.Float32:
		return 0
	case tensor.Float64:
		return 1
	}
	return 2
}

// Gelu runs gelu_* (dy nil) or gelu_grad_* over n elements with threads
// threads; y, dy and x are host tensors of one dtype.
func Gelu(y, dy, x *tensor.Tensor, threads int) {
	var d unsafe.Pointer
	if dy != nil {
		d = ptr(tensor.HostBytes(dy))
	}
	C.emu_gelu(code(x.DType()), ptr(tensor.HostBytes(y)), d, ptr(tensor.HostBytes(x)), C.ulonglong(x.Len()), C.uint(threads))
}

// MSE runs mse_* with threads threads, then the two sum stages, as the
// provider launches them; it returns the sum.
func MSE(dy, y, t *tensor.Tensor, scale float64, threads, sumThreads int) float64 {
	part := make([]float64, threads)
	C.emu_mse(code(y.DType()), ptr(tensor.HostBytes(dy)), (*C.double)(ptr(part)), ptr(tensor.HostBytes(y)), ptr(tensor.HostBytes(t)),
		C.double(scale), C.ulonglong(y.Len()), C.uint(threads))
	part2 := make([]float64, sumThreads)
	C.emu_sum_stage((*C.double)(ptr(part2)), (*C.double)(ptr(part)), C.ulonglong(threads), C.uint(sumThreads))
	var sum [1]float64
	C.emu_sum_stage((*C.double)(ptr(sum[:])), (*C.double)(ptr(part2)), C.ulonglong(sumThreads), 1)
	return sum[0]
}

// Axpy runs axpy_bf16.
func Axpy(alpha float32, x, y *tensor.Tensor, threads int) {
	C.emu_axpy_bf16(ptr(tensor.HostBytes(y)), ptr(tensor.HostBytes(x)), C.float(alpha), C.ulonglong(y.Len()), C.uint(threads))
}

// Cast runs cast_f32_bf16 or cast_bf16_f32 (by dst's dtype).
func Cast(dst, src *tensor.Tensor, threads int) {
	to16 := C.int(0)
	if dst.DType() == tensor.BFloat16 {
		to16 = 1
	}
	C.emu_cast(to16, ptr(tensor.HostBytes(dst)), ptr(tensor.HostBytes(src)), C.ulonglong(dst.Len()), C.uint(threads))
}

// BiasGrad runs bias_grad_bf16 (db bfloat16) or bias_grad_bf16_f32 (db
// float32) over dy's m rows of n.
func BiasGrad(db, dy *tensor.Tensor, m, n int, accumulate bool, threads int) {
	acc, db32 := C.int(0), C.int(0)
	if accumulate {
		acc = 1
	}
	if db.DType() == tensor.Float32 {
		db32 = 1
	}
	C.emu_bias_grad_bf16(ptr(tensor.HostBytes(db)), db32, ptr(tensor.HostBytes(dy)), C.ulonglong(m), C.ulonglong(n), acc, C.uint(threads))
}

// bytesOf is t's host bytes, or nil for a nil tensor.
func bytesOf(t *tensor.Tensor) unsafe.Pointer {
	if t == nil {
		return nil
	}
	return ptr(tensor.HostBytes(t))
}

func f32(t *tensor.Tensor) *C.float { return (*C.float)(bytesOf(t)) }

func isBF(t *tensor.Tensor) C.int {
	if t.DType() == tensor.BFloat16 {
		return 1
	}
	return 0
}

func flag(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// LayerNorm runs layer_norm_* (stats float32).
func LayerNorm(y, stats, x, gamma, beta *tensor.Tensor, rows, d int, eps float64, threads int) {
	C.emu_layer_norm(isBF(x), bytesOf(y), f32(stats), bytesOf(x), bytesOf(gamma), bytesOf(beta), C.ulonglong(rows), C.ulonglong(d), C.double(eps), C.uint(threads))
}

// LayerNormBackward runs layer_norm_dx_* (dx not nil) and layer_norm_dgb_*
// (dgamma or dbeta not nil).
func LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats *tensor.Tensor, rows, d int, accumulate bool, threads int) {
	if dx != nil {
		C.emu_layer_norm_dx(isBF(x), bytesOf(dx), bytesOf(dy), bytesOf(x), bytesOf(gamma), f32(stats), C.ulonglong(rows), C.ulonglong(d), C.uint(threads))
	}
	if dgamma != nil || dbeta != nil {
		C.emu_layer_norm_dgb(isBF(x), bytesOf(dgamma), bytesOf(dbeta), bytesOf(dy), bytesOf(x), f32(stats), C.ulonglong(rows), C.ulonglong(d), flag(accumulate), C.uint(threads))
	}
}

// Embedding runs embedding_*.
func Embedding(y, ids, table *tensor.Tensor, offset, rows, d, n, threads int) {
	C.emu_embedding(isBF(table), bytesOf(y), f32(ids), bytesOf(table), C.longlong(offset), C.ulonglong(rows), C.ulonglong(d), C.ulonglong(n), C.uint(threads))
}

// EmbeddingGrad runs embedding_grad_* into a float32 dtable.
func EmbeddingGrad(dtable, dy, ids *tensor.Tensor, offset, rows, d, n, threads int) {
	C.emu_embedding_grad(isBF(dy), f32(dtable), bytesOf(dy), f32(ids), C.longlong(offset), C.ulonglong(rows), C.ulonglong(d), C.ulonglong(n), C.uint(threads))
}

// CrossEntropy runs cross_entropy_*.
func CrossEntropy(stats, logits, targets *tensor.Tensor, offset, v, t, threads int) {
	C.emu_cross_entropy(isBF(logits), f32(stats), bytesOf(logits), f32(targets), C.longlong(offset), C.ulonglong(v), C.ulonglong(t), C.uint(threads))
}

// CrossEntropyBackward runs cross_entropy_grad_*.
func CrossEntropyBackward(dl, logits, targets, lse *tensor.Tensor, offset, v, t int, scale float64, threads int) {
	C.emu_cross_entropy_grad(isBF(logits), bytesOf(dl), bytesOf(logits), f32(targets), f32(lse), C.longlong(offset), C.ulonglong(v), C.ulonglong(t), C.double(scale), C.uint(threads))
}

// CrossEntropyCombine runs cross_entropy_combine then sum_rows; it returns
// the loss.
func CrossEntropyCombine(lse, stats *tensor.Tensor, parts, rows, threads int) float64 {
	part := make([]float64, max(rows, 1))
	return float64(C.emu_cross_entropy_combine(f32(lse), (*C.double)(ptr(part)), f32(stats), C.ulonglong(parts), C.ulonglong(rows), C.uint(threads)))
}

// AdamW runs adamw_f32 with step a's factors.
func AdamW(a kernels.AdamWParams, param, grad, m, v *tensor.Tensor, threads int) {
	k := a.Scalars()
	C.emu_adamw(f32(param), f32(grad), f32(m), f32(v), C.ulonglong(param.Len()), C.float(k.Decay), C.float(k.Step), C.float(k.Root), C.float(k.Eps), C.float(k.W1), C.float(k.B2), C.uint(threads))
}

// at is the host address of element off of t.
func at(t *tensor.Tensor, off int) unsafe.Pointer {
	b := tensor.HostBytes(t)
	if off*t.DType().Size() >= len(b) {
		return nil
	}
	return unsafe.Pointer(&b[off*t.DType().Size()])
}

// views returns the q, k and v (or dq, dk, dv) addresses of an attention.
func views(a Attn, q, k, v *tensor.Tensor) (unsafe.Pointer, unsafe.Pointer, unsafe.Pointer) {
	if a.Packed {
		return at(q, 0), at(q, a.KOff), at(q, a.VOff)
	}
	return bytesOf(q), bytesOf(k), bytesOf(v)
}

// Attention runs attn_fwd_*.
func Attention(o, lse, q, k, v *tensor.Tensor, causal bool, threads int) error {
	a, err := AttnShape(o, lse, q, k, v)
	if err != nil {
		return err
	}
	qp, kp, vp := views(a, q, k, v)
	args := a.Args()
	C.emu_attn_fwd(isBF(q), bytesOf(o), f32(lse), qp, kp, vp, (*C.ulonglong)(unsafe.Pointer(&args[0])), flag(causal), C.uint(threads))
	return nil
}

// AttentionBackward runs attn_delta_*, attn_dq_* and attn_dkv_*.
func AttentionBackward(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool, threads int) error {
	a, err := AttnShape(o, lse, q, k, v)
	if err != nil {
		return err
	}
	qp, kp, vp := views(a, q, k, v)
	gq, gk, gv := views(a, dq, dk, dv)
	delta := make([]float64, max(a.B*a.H*a.S, 1))
	args := a.Args()
	C.emu_attn_bwd(isBF(q), gq, gk, gv, bytesOf(do), qp, kp, vp, bytesOf(o), f32(lse), (*C.double)(ptr(delta)),
		(*C.ulonglong)(unsafe.Pointer(&args[0])), flag(causal), C.uint(threads))
	return nil
}
