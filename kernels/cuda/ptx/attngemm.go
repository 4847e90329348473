package ptx

import "math"

// The GEMMs of the cuda provider's attention through cuBLAS, as data: the
// provider runs them on cuBLAS (one strided-batched call per batch, a
// batch per head), the emulation's test on the host, so that their shapes
// and strides are checked without a GPU. Every GEMM is row-major float32,
// C = Alpha·op(A)·op(B), its operands named; head h of batch b of operand A
// starts BA·b + SA·h elements from A's address (B and C likewise).

// Operand names a tensor an attention GEMM reads or writes.
type Operand uint8

// The operands: q, k, v, o and their gradients in the [batch, tokens,
// heads, width] layout (k and v views of a packed q at KOff and VOff, dk
// and dv of a packed dq likewise), and one batch's scores P and their
// gradient dS, heads × S × T (float32), and on the bfloat16 path their
// bfloat16 roundings P16 and DS16, which the GEMMs after the softmax and
// after attn_ds read (Half).
const (
	OpQ Operand = iota
	OpK
	OpV
	OpO
	OpDO
	OpDQ
	OpDK
	OpDV
	OpP
	OpDS
	OpP16
	OpDS16
)

// Half is g reading P or dS (always its A operand) as their bfloat16
// roundings: on the bfloat16 path every GEMM multiplies bfloat16 operands
// (on tensor cores, accumulating in float32), so the probabilities and the
// scores' gradient are rounded once before they are multiplied, as
// FlashAttention's bfloat16 kernels do.
func Half(g HeadGEMM) HeadGEMM {
	switch g.A {
	case OpP:
		g.A = OpP16
	case OpDS:
		g.A = OpDS16
	}
	return g
}

// HeadGEMM is one GEMM over the heads of one batch.
type HeadGEMM struct {
	M, N, K        int
	TransA, TransB bool
	Alpha          float64
	A, B, C        Operand
	LDA, LDB, LDC  int
	SA, SB, SC     int // elements between heads
	BA, BB, BC     int // elements between batches (0: the scores, one batch's)
}

// Scores is P = q·kᵀ/√E (before the softmax).
func (a Attn) Scores() HeadGEMM {
	return HeadGEMM{M: a.S, N: a.T, K: a.E, TransB: true, Alpha: 1 / math.Sqrt(float64(a.E)),
		A: OpQ, LDA: a.H * a.QS, SA: a.QS, BA: a.S * a.H * a.QS,
		B: OpK, LDB: a.H * a.KS, SB: a.KS, BB: a.T * a.H * a.KS,
		C: OpP, LDC: a.T, SC: a.S * a.T}
}

// Out is o = P·v.
func (a Attn) Out() HeadGEMM {
	return HeadGEMM{M: a.S, N: a.F, K: a.T, Alpha: 1,
		A: OpP, LDA: a.T, SA: a.S * a.T,
		B: OpV, LDB: a.H * a.VS, SB: a.VS, BB: a.T * a.H * a.VS,
		C: OpO, LDC: a.H * a.F, SC: a.F, BC: a.S * a.H * a.F}
}

// Backward are the backward's GEMMs in order: dS = do·vᵀ (dP, made ds by
// attn_ds after dv), dv = Pᵀ·do, dq = ds·k, dk = dsᵀ·q.
func (a Attn) Backward() (dp, dv, dq, dk HeadGEMM) {
	dp = HeadGEMM{M: a.S, N: a.T, K: a.F, TransB: true, Alpha: 1,
		A: OpDO, LDA: a.H * a.F, SA: a.F, BA: a.S * a.H * a.F,
		B: OpV, LDB: a.H * a.VS, SB: a.VS, BB: a.T * a.H * a.VS,
		C: OpDS, LDC: a.T, SC: a.S * a.T}
	dv = HeadGEMM{M: a.T, N: a.F, K: a.S, TransA: true, Alpha: 1,
		A: OpP, LDA: a.T, SA: a.S * a.T,
		B: OpDO, LDB: a.H * a.F, SB: a.F, BB: a.S * a.H * a.F,
		C: OpDV, LDC: a.H * a.VS, SC: a.VS, BC: a.T * a.H * a.VS}
	dq = HeadGEMM{M: a.S, N: a.E, K: a.T, Alpha: 1,
		A: OpDS, LDA: a.T, SA: a.S * a.T,
		B: OpK, LDB: a.H * a.KS, SB: a.KS, BB: a.T * a.H * a.KS,
		C: OpDQ, LDC: a.H * a.QS, SC: a.QS, BC: a.S * a.H * a.QS}
	dk = HeadGEMM{M: a.T, N: a.E, K: a.S, TransA: true, Alpha: 1,
		A: OpDS, LDA: a.T, SA: a.S * a.T,
		B: OpQ, LDB: a.H * a.QS, SB: a.QS, BB: a.S * a.H * a.QS,
		C: OpDK, LDC: a.H * a.KS, SC: a.KS, BC: a.T * a.H * a.KS}
	return dp, dv, dq, dk
}
