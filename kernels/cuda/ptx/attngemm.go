package ptx

import "math"

// The GEMMs of the cuda provider's attention through cuBLAS, as data: the
// provider runs them on cuBLAS (strided-batched calls, Calls), the
// emulation's test on the host, so that their shapes and strides are
// checked without a GPU. Every GEMM is row-major, C = Alpha·op(A)·op(B),
// its operands named; head h of batch b of operand A starts BA·b + SA·h
// elements from A's address (B and C likewise). The attention runs over
// chunks of batches (ChunkBatches): the scores P and dS (and their
// bfloat16 copies) hold one chunk's batches, their b counted from the
// chunk's first.

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
	BA, BB, BC     int // elements between batches
}

// Scores is P = q·kᵀ/√E (before the softmax).
func (a Attn) Scores() HeadGEMM {
	return HeadGEMM{M: a.S, N: a.T, K: a.E, TransB: true, Alpha: 1 / math.Sqrt(float64(a.E)),
		A: OpQ, LDA: a.H * a.QS, SA: a.QS, BA: a.S * a.H * a.QS,
		B: OpK, LDB: a.H * a.KS, SB: a.KS, BB: a.T * a.H * a.KS,
		C: OpP, LDC: a.T, SC: a.S * a.T, BC: a.H * a.S * a.T}
}

// Out is o = P·v.
func (a Attn) Out() HeadGEMM {
	return HeadGEMM{M: a.S, N: a.F, K: a.T, Alpha: 1,
		A: OpP, LDA: a.T, SA: a.S * a.T, BA: a.H * a.S * a.T,
		B: OpV, LDB: a.H * a.VS, SB: a.VS, BB: a.T * a.H * a.VS,
		C: OpO, LDC: a.H * a.F, SC: a.F, BC: a.S * a.H * a.F}
}

// Backward are the backward's GEMMs in order: dS = do·vᵀ (dP, made ds by
// attn_ds after dv), dv = Pᵀ·do, dq = ds·k, dk = dsᵀ·q.
func (a Attn) Backward() (dp, dv, dq, dk HeadGEMM) {
	dp = HeadGEMM{M: a.S, N: a.T, K: a.F, TransB: true, Alpha: 1,
		A: OpDO, LDA: a.H * a.F, SA: a.F, BA: a.S * a.H * a.F,
		B: OpV, LDB: a.H * a.VS, SB: a.VS, BB: a.T * a.H * a.VS,
		C: OpDS, LDC: a.T, SC: a.S * a.T, BC: a.H * a.S * a.T}
	dv = HeadGEMM{M: a.T, N: a.F, K: a.S, TransA: true, Alpha: 1,
		A: OpP, LDA: a.T, SA: a.S * a.T, BA: a.H * a.S * a.T,
		B: OpDO, LDB: a.H * a.F, SB: a.F, BB: a.S * a.H * a.F,
		C: OpDV, LDC: a.H * a.VS, SC: a.VS, BC: a.T * a.H * a.VS}
	dq = HeadGEMM{M: a.S, N: a.E, K: a.T, Alpha: 1,
		A: OpDS, LDA: a.T, SA: a.S * a.T, BA: a.H * a.S * a.T,
		B: OpK, LDB: a.H * a.KS, SB: a.KS, BB: a.T * a.H * a.KS,
		C: OpDQ, LDC: a.H * a.QS, SC: a.QS, BC: a.S * a.H * a.QS}
	dk = HeadGEMM{M: a.T, N: a.E, K: a.S, TransA: true, Alpha: 1,
		A: OpDS, LDA: a.T, SA: a.S * a.T, BA: a.H * a.S * a.T,
		B: OpQ, LDB: a.H * a.QS, SB: a.QS, BB: a.S * a.H * a.QS,
		C: OpDK, LDC: a.H * a.KS, SC: a.KS, BC: a.T * a.H * a.KS}
	return dp, dv, dq, dk
}

// AttnScratchBudget bounds the bytes of one chunk's scores scratch on the
// GEMM path: ChunkBatches takes as many batches as fit (at least one).
const AttnScratchBudget = 256 << 20

// ScoreBytes is the GEMM path's scratch per score: the float32 scores
// (twice in the backward: P and dS), their bfloat16 copies on the bfloat16
// path, and the forward softmax's partial sums (16 bytes per segment of
// SoftmaxSeg scores: within a byte per score).
func ScoreBytes(bf16, backward bool) int {
	n := 4
	if bf16 {
		n += 2
	}
	if backward {
		return 2 * n
	}
	return n + 1
}

// ChunkBatches is how many batches one chunk of the GEMM path takes when
// each score costs perScore bytes of scratch: as many as fit in budget
// bytes, at least one, at most a.B.
func (a Attn) ChunkBatches(perScore, budget int) int {
	one := a.H * a.S * a.T * perScore
	if one <= 0 {
		return max(a.B, 1)
	}
	return min(max(budget/one, 1), max(a.B, 1))
}

// GEMMCall is one strided-batched call of a HeadGEMM: Count GEMMs, the
// i-th with operands A, B and C at Off + i·Stride elements from their
// addresses.
type GEMMCall struct {
	Count  int
	Off    [3]int
	Stride [3]int
}

// chunked reports whether op lives in the chunk's scratch (its batches
// counted from the chunk's first).
func chunked(op Operand) bool { return op == OpP || op == OpDS || op == OpP16 || op == OpDS16 }

// Calls splits g over the batches b0 to b0+nb−1 into strided-batched calls,
// whichever way takes fewer: one per batch over its heads (head strides),
// or one per head over the batches (batch strides).
func (a Attn) Calls(g HeadGEMM, b0, nb int) []GEMMCall {
	ops := [3]Operand{g.A, g.B, g.C}
	bs, hs := [3]int{g.BA, g.BB, g.BC}, [3]int{g.SA, g.SB, g.SC}
	batch := func(x, b int) int {
		if chunked(ops[x]) {
			b -= b0
		}
		return b * bs[x]
	}
	var calls []GEMMCall
	if nb <= a.H {
		for b := b0; b < b0+nb; b++ {
			c := GEMMCall{Count: a.H, Stride: hs}
			for x := range ops {
				c.Off[x] = batch(x, b)
			}
			calls = append(calls, c)
		}
		return calls
	}
	for h := range a.H {
		c := GEMMCall{Count: nb, Stride: bs}
		for x := range ops {
			c.Off[x] = batch(x, b0) + h*hs[x]
		}
		calls = append(calls, c)
	}
	return calls
}
