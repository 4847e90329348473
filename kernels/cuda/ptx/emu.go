//go:build cudaemu

// The emulation: the kernels of kernels.h run on the CPU, one thread after
// another. The sums follow the provider's launch shapes (MSEThreads,
// SumStages).

package ptx

/*
#cgo CXXFLAGS: -std=c++17 -O2
#include "emu.h"
*/
import "C"

import (
	"fmt"
	"math"
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
func MSE(dy, y, t *tensor.Tensor, scale float64, threads int) float64 {
	part := make([]float64, threads)
	C.emu_mse(code(y.DType()), ptr(tensor.HostBytes(dy)), (*C.double)(ptr(part)), ptr(tensor.HostBytes(y)), ptr(tensor.HostBytes(t)),
		C.double(scale), C.ulonglong(y.Len()), C.uint(threads))
	for _, n := range SumStages(threads) {
		next := make([]float64, n)
		C.emu_sum_stage((*C.double)(ptr(next)), (*C.double)(ptr(part)), C.ulonglong(len(part)), C.uint(n))
		part = next
	}
	return part[0]
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

// BiasGrad runs bias_part_bf16 over chunks of BiasChunk rows, then
// bias_sum_bf16 (db bfloat16) or bias_sum_bf16_f32 (db float32), over dy's
// m rows of n.
func BiasGrad(db, dy *tensor.Tensor, m, n int, accumulate bool, threads int) {
	acc, db32 := C.int(0), C.int(0)
	if accumulate {
		acc = 1
	}
	if db.DType() == tensor.Float32 {
		db32 = 1
	}
	C.emu_bias_grad_bf16(ptr(tensor.HostBytes(db)), db32, ptr(tensor.HostBytes(dy)), C.ulonglong(m), C.ulonglong(n), acc, BiasChunk, C.uint(threads))
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

// LayerNorm runs the layer norm's stages (ln_part, ln_row, ln_apply; stats
// float32), rows in segments of seg columns.
func LayerNorm(y, stats, x, gamma, beta *tensor.Tensor, rows, d int, eps float64, seg, threads int) {
	C.emu_layer_norm(isBF(x), bytesOf(y), f32(stats), bytesOf(x), bytesOf(gamma), bytesOf(beta), C.ulonglong(rows), C.ulonglong(d), C.double(eps),
		C.ulonglong(seg), C.uint(threads))
}

// Orders of SetOrder: a block's threads free (as OS threads, the default),
// or taking turns between its barriers in ascending or descending MR_TX.
const (
	OrderFree = iota
	OrderAscending
	OrderDescending
)

// SetOrder sets how the block kernels' threads run. A kernel whose block
// reads what another thread wrote only across a barrier gives the same
// bits in every order; one that misses a barrier reads the other thread's
// value in one order and the old one in the other.
func SetOrder(order int) { C.emu_set_order(C.int(order)) }

// LayerNormBlock runs ln_block_*: a block of LayerNormThreads per row.
func LayerNormBlock(y, stats, x, gamma, beta *tensor.Tensor, rows, d int, eps float64) {
	C.emu_layer_norm_block(isBF(x), bytesOf(y), f32(stats), bytesOf(x), bytesOf(gamma), bytesOf(beta), C.ulonglong(rows), C.ulonglong(d), C.double(eps))
}

// LayerNormDXBlock runs ln_dx_block_*: a block of LayerNormThreads per row.
func LayerNormDXBlock(dx, dy, x, gamma, stats *tensor.Tensor, rows, d int) {
	C.emu_layer_norm_dx_block(isBF(x), bytesOf(dx), bytesOf(dy), bytesOf(x), bytesOf(gamma), f32(stats), C.ulonglong(rows), C.ulonglong(d))
}

// LayerNormBackward runs ln_dx_part and ln_dx_apply (dx not nil), rows in
// segments of seg columns, and ln_dgb_part and ln_dgb_sum (dgamma or dbeta
// not nil), columns in chunks of chunk rows.
func LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats *tensor.Tensor, rows, d int, accumulate bool, seg, chunk, threads int) {
	if dx != nil {
		C.emu_layer_norm_dx(isBF(x), bytesOf(dx), bytesOf(dy), bytesOf(x), bytesOf(gamma), f32(stats), C.ulonglong(rows), C.ulonglong(d),
			C.ulonglong(seg), C.uint(threads))
	}
	if dgamma != nil || dbeta != nil {
		C.emu_layer_norm_dgb(isBF(x), bytesOf(dgamma), bytesOf(dbeta), bytesOf(dy), bytesOf(x), f32(stats), C.ulonglong(rows), C.ulonglong(d),
			flag(accumulate), C.ulonglong(chunk), C.uint(threads))
	}
}

// Embedding runs embedding_*.
func Embedding(y, ids, table *tensor.Tensor, offset, rows, d, n, threads int) {
	C.emu_embedding(isBF(table), bytesOf(y), f32(ids), bytesOf(table), C.longlong(offset), C.ulonglong(rows), C.ulonglong(d), C.ulonglong(n), C.uint(threads))
}

// EmbeddingGrad runs embedding_grad_* into a float32 dtable, or with chunk
// > 0 emb_part_* over chunks of chunk tokens and emb_sum.
func EmbeddingGrad(dtable, dy, ids *tensor.Tensor, offset, rows, d, n, chunk, threads int) {
	C.emu_embedding_grad(isBF(dy), f32(dtable), bytesOf(dy), f32(ids), C.longlong(offset), C.ulonglong(rows), C.ulonglong(d), C.ulonglong(n),
		C.ulonglong(chunk), C.uint(threads))
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

// flashShape is AttnShape for the fused kernels, which take head dims up
// to FlashHeadDim.
func flashShape(o, lse, q, k, v *tensor.Tensor) (Attn, error) {
	a, err := AttnShape(o, lse, q, k, v)
	if err == nil && !a.Flash() {
		err = fmt.Errorf("ptx: attention of head dims %d and %d: the fused kernels take up to %d", a.E, a.F, FlashHeadDim)
	}
	return a, err
}

// FlashAttention runs attn_flash_fwd_* (the fused kernel), a block at a
// time, its threads together.
func FlashAttention(o, lse, q, k, v *tensor.Tensor, causal bool, threads int) error {
	a, err := flashShape(o, lse, q, k, v)
	if err != nil {
		return err
	}
	qp, kp, vp := views(a, q, k, v)
	args := a.Args()
	C.emu_attn_flash_fwd(isBF(q), bytesOf(o), f32(lse), qp, kp, vp, (*C.ulonglong)(unsafe.Pointer(&args[0])), flag(causal))
	return nil
}

// FlashAttentionBackward runs attn_delta_* (threads of it), then
// attn_flash_dq_* and attn_flash_dkv_*.
func FlashAttentionBackward(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool, threads int) error {
	a, err := flashShape(o, lse, q, k, v)
	if err != nil {
		return err
	}
	attnBackward(a, true, dq, dk, dv, do, q, k, v, o, lse, causal, threads)
	return nil
}

// attnBackward runs the backward kernels of shape a: the fused ones or
// the one-row-per-thread ones.
func attnBackward(a Attn, fused bool, dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool, threads int) {
	qp, kp, vp := views(a, q, k, v)
	gq, gk, gv := views(a, dq, dk, dv)
	delta := make([]float64, max(a.B*a.H*a.S, 1))
	args := a.Args()
	dp, ap := (*C.double)(ptr(delta)), (*C.ulonglong)(unsafe.Pointer(&args[0]))
	if fused {
		C.emu_attn_flash_bwd(isBF(q), gq, gk, gv, bytesOf(do), qp, kp, vp, bytesOf(o), f32(lse), dp, ap, flag(causal), C.uint(threads))
		return
	}
	C.emu_attn_bwd(isBF(q), gq, gk, gv, bytesOf(do), qp, kp, vp, bytesOf(o), f32(lse), dp, ap, flag(causal), C.uint(threads))
}

// AttentionBackward runs attn_delta_*, attn_dq_* and attn_dkv_*.
func AttentionBackward(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool, threads int) error {
	a, err := AttnShape(o, lse, q, k, v)
	if err != nil {
		return err
	}
	attnBackward(a, false, dq, dk, dv, do, q, k, v, o, lse, causal, threads)
	return nil
}

// operand is a float32 tensor's elements from an offset: an attention
// GEMM's operand on the host.
type operand struct {
	x   []float32
	off int
}

// hostGEMM runs g over the batches b0 to b0+nb−1 on the host, in the
// calls the provider makes (Attn.Calls), in float64 sums rounded to
// float32 (the provider runs them on cuBLAS).
func hostGEMM(a Attn, g HeadGEMM, ops map[Operand]operand, b0, nb int) {
	A, B, out := ops[g.A], ops[g.B], ops[g.C]
	for _, c := range a.Calls(g, b0, nb) {
		for n := range c.Count {
			ao, bo, co := A.off+c.Off[0]+n*c.Stride[0], B.off+c.Off[1]+n*c.Stride[1], out.off+c.Off[2]+n*c.Stride[2]
			for i := range g.M {
				for j := range g.N {
					s := 0.0
					for kk := range g.K {
						ai, bi := ao+i*g.LDA+kk, bo+kk*g.LDB+j
						if g.TransA {
							ai = ao + kk*g.LDA + i
						}
						if g.TransB {
							bi = bo + j*g.LDB + kk
						}
						s += float64(A.x[ai]) * float64(B.x[bi])
					}
					out.x[co+i*g.LDC+j] = float32(g.Alpha * s)
				}
			}
		}
	}
}

// attnOps are the operands of a float32 attention: q, k and v (views of a
// packed q), o, and their gradients where given.
func attnOps(a Attn, q, k, v, o, do, dq, dk, dv *tensor.Tensor) map[Operand]operand {
	ops := map[Operand]operand{}
	put := func(qo, ko, vo Operand, q, k, v *tensor.Tensor) {
		if q == nil {
			return
		}
		if a.Packed {
			ops[qo], ops[ko], ops[vo] = operand{q.Float32(), 0}, operand{q.Float32(), a.KOff}, operand{q.Float32(), a.VOff}
			return
		}
		ops[qo], ops[ko], ops[vo] = operand{q.Float32(), 0}, operand{k.Float32(), 0}, operand{v.Float32(), 0}
	}
	put(OpQ, OpK, OpV, q, k, v)
	put(OpDQ, OpDK, OpDV, dq, dk, dv)
	for op, t := range map[Operand]*tensor.Tensor{OpO: o, OpDO: do} {
		if t != nil {
			ops[op] = operand{t.Float32(), 0}
		}
	}
	return ops
}

// attnBudget is the emulation's AttnScratchBudget (the tests lower it to
// run several chunks).
var attnBudget = AttnScratchBudget

// AttentionGEMM runs the provider's attention through GEMMs, over chunks of
// batches (ChunkBatches): per chunk the Scores GEMM, the softmax in stages
// (attn_smax_*), the Out GEMM, the GEMMs on the host in the provider's
// calls. float32, or bfloat16 as the provider runs it: the operands
// multiplied as they are (widened exactly here), the scores and their
// softmax in float32, P rounded to bfloat16 for the Out GEMM (Half), o
// rounded once.
func AttentionGEMM(o, lse, q, k, v *tensor.Tensor, causal bool, threads int) error {
	a, err := AttnShape(o, lse, q, k, v)
	if err != nil {
		return err
	}
	bf := q.DType() == tensor.BFloat16
	o32 := asF32(o, bf, false)
	ops := attnOps(a, asF32(q, bf, true), asF32(k, bf, true), asF32(v, bf, true), o32, nil, nil, nil, nil)
	nb := a.ChunkBatches(ScoreBytes(bf, false), attnBudget)
	n := nb * a.H * a.S * a.T
	sc := make([]float32, n)
	ops[OpP] = operand{sc, 0}
	p16 := half(ops, OpP16, bf, n)
	hs := a.H * a.S
	for b0 := 0; b0 < a.B; b0 += nb {
		c := min(nb, a.B-b0)
		hostGEMM(a, a.Scores(), ops, b0, c)
		C.emu_attn_softmax((*C.float)(ptr(sc)), p16.ptr(), (*C.float)(at(lse, b0*hs)), C.ulonglong(c*hs), C.ulonglong(a.S), C.ulonglong(a.T), flag(causal), 0, SoftmaxSeg, C.uint(threads))
		hostGEMM(a, p16.use(a.Out()), ops, b0, c)
	}
	return narrow(o, o32)
}

// AttentionBackwardGEMM runs the provider's attention backward through
// GEMMs: attn_delta, then per chunk of batches the Scores GEMM,
// attn_smax_exp from lse, the dP and dv GEMMs, attn_ds_f32, the dq and dk
// GEMMs. bfloat16 as AttentionGEMM: P and dS rounded to bfloat16 for the
// dv, dq and dk GEMMs, the gradients rounded once.
func AttentionBackwardGEMM(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool, threads int) error {
	a, err := AttnShape(o, lse, q, k, v)
	if err != nil {
		return err
	}
	bf := q.DType() == tensor.BFloat16
	delta := make([]float64, max(a.B*a.H*a.S, 1))
	C.emu_attn_delta(isBF(q), (*C.double)(ptr(delta)), bytesOf(do), bytesOf(o), C.ulonglong(a.B), C.ulonglong(a.H), C.ulonglong(a.S), C.ulonglong(a.F), C.uint(threads))
	dq32, dk32, dv32 := asF32(dq, bf, false), asF32(dk, bf, false), asF32(dv, bf, false)
	ops := attnOps(a, asF32(q, bf, true), asF32(k, bf, true), asF32(v, bf, true), nil, asF32(do, bf, true), dq32, dk32, dv32)
	nb := a.ChunkBatches(ScoreBytes(bf, true), attnBudget)
	n := nb * a.H * a.S * a.T
	p, ds := make([]float32, n), make([]float32, n)
	ops[OpP], ops[OpDS] = operand{p, 0}, operand{ds, 0}
	p16, ds16 := half(ops, OpP16, bf, n), half(ops, OpDS16, bf, n)
	dpG, dvG, dqG, dkG := a.Backward()
	hs := a.H * a.S
	scale := float32(1 / math.Sqrt(float64(a.E)))
	for b0 := 0; b0 < a.B; b0 += nb {
		c := min(nb, a.B-b0)
		hostGEMM(a, a.Scores(), ops, b0, c)
		C.emu_attn_softmax((*C.float)(ptr(p)), p16.ptr(), (*C.float)(at(lse, b0*hs)), C.ulonglong(c*hs), C.ulonglong(a.S), C.ulonglong(a.T), flag(causal), 1, SoftmaxSeg, C.uint(threads))
		hostGEMM(a, dpG, ops, b0, c)
		hostGEMM(a, p16.use(dvG), ops, b0, c)
		C.emu_attn_ds((*C.float)(ptr(ds)), ds16.ptr(), (*C.float)(ptr(p)), (*C.double)(ptr(delta[b0*hs:])), C.ulonglong(c*hs), C.ulonglong(a.T), C.float(scale), C.uint(threads))
		hostGEMM(a, ds16.use(dqG), ops, b0, c)
		hostGEMM(a, ds16.use(dkG), ops, b0, c)
	}
	for _, t := range [][2]*tensor.Tensor{{dq, dq32}, {dk, dk32}, {dv, dv32}} {
		if err := narrow(t[0], t[1]); err != nil {
			return err
		}
	}
	return nil
}

// asF32 is t as float32 on the bfloat16 path (bf): its values widened (exact)
// when in, else a zeroed float32 tensor of its shape for a result; t itself
// otherwise (nil stays nil).
func asF32(t *tensor.Tensor, bf, in bool) *tensor.Tensor {
	if t == nil || !bf {
		return t
	}
	if !in {
		return tensor.New(tensor.Float32, t.Shape()...)
	}
	w, err := tensor.Convert(t, tensor.Float32)
	if err != nil {
		panic(err) // a bfloat16 tensor always widens
	}
	return w
}

// narrow rounds the float32 results r into t (once), where they differ.
func narrow(t, r *tensor.Tensor) error {
	if t == nil || t == r {
		return nil
	}
	c, err := tensor.Convert(r, t.DType())
	if err != nil {
		return err
	}
	copy(tensor.HostBytes(t), tensor.HostBytes(c))
	return nil
}

// halfOp is a bfloat16 copy of P or dS that a kernel writes (bits) and the
// host GEMMs read (widened into the operand), on the bfloat16 path.
type halfOp struct {
	bits []uint16
	wide []float32
}

// half makes the bfloat16 copy of n elements as operand op on the bfloat16
// path (bf); none otherwise.
func half(ops map[Operand]operand, op Operand, bf bool, n int) *halfOp {
	if !bf {
		return nil
	}
	h := &halfOp{bits: make([]uint16, n), wide: make([]float32, n)}
	ops[op] = operand{h.wide, 0}
	return h
}

// ptr is where the kernel writes the copy: nil off the bfloat16 path.
func (h *halfOp) ptr() unsafe.Pointer {
	if h == nil {
		return nil
	}
	return unsafe.Pointer(&h.bits[0])
}

// use is g reading the copy (Half), widened from what the kernel wrote;
// g itself off the bfloat16 path.
func (h *halfOp) use(g HeadGEMM) HeadGEMM {
	if h == nil {
		return g
	}
	for i, b := range h.bits {
		h.wide[i] = tensor.BF16(b).Float32()
	}
	return Half(g)
}
