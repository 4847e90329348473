package kernels

import (
	"errors"
	"slices"

	"github.com/meshrun/meshrun/tensor"
)

// Empty operands. Uneven sharding gives ranks shards of zero rows or zero
// columns (a weight split seven ways over eight ranks), so every op sees M, N
// or K = 0 in ordinary training. BLAS libraries differ on what they do then
// (gorgonia's cuBLAS binding takes &a[0] of an empty slice and panics; cuBLASLt
// may refuse a zero-sized layout), so no provider hands such a GEMM to its
// library: each provider's Gemm calls EmptyGemm after CheckGemm, and the
// definition below is what every provider computes.
//
// With R = Alpha·op(A)·op(B) + Beta·C:
//
//   - M = 0 or N = 0: C has no elements. The epilogue's bias gradient is
//     still defined: DGeluBGrad's Bias[N] sums no rows (zeros) when M = 0;
//     BGrad's Bias[M] is Σ over k of op(A)[i, k] when N = 0 (a GEMM of op(A)
//     and a vector of ones, or zeros when K = 0 too).
//   - K = 0 (M, N > 0): R = Beta·C (C not read when Beta = 0), then the
//     epilogue on R as always: the GEMM runs with K = 1 over a column and a
//     row of zeros, so the provider's own GEMM and epilogue compute exactly
//     that, and its library never sees an empty dimension.

// EmptyGemm serves a checked GEMM (CheckGemm's result) that has an empty
// dimension, on k (the provider itself) with scratch in mem (its memory);
// it reports false, doing nothing, when M, N and K are all positive.
func EmptyGemm(k Kernels, mem tensor.Memory, g GemmParams, o GemmOperands) (bool, error) {
	switch {
	case g.M > 0 && g.N > 0 && g.K > 0:
		return false, nil
	case g.M > 0 && g.N > 0: // K = 0
		return true, emptyInner(k, mem, g, o)
	}
	switch {
	case g.Epilogue == EpilogueDGeluBGrad && g.M == 0 && g.N > 0:
		return true, mem.Zero(o.Bias, 0, g.N*o.Bias.DType().Size())
	case g.Epilogue == EpilogueBGrad && g.N == 0 && g.M > 0:
		if g.K == 0 {
			return true, mem.Zero(o.Bias, 0, g.M*o.Bias.DType().Size())
		}
		return true, rowSums(k, mem, g, o)
	}
	return true, nil
}

// emptyInner runs a K = 0 GEMM as a K = 1 GEMM of zeros: A' is M×1 and B'
// 1×N per batch, all zero, tight.
func emptyInner(k Kernels, mem tensor.Memory, g GemmParams, o GemmOperands) (err error) {
	a, err := mem.Alloc(g.DType, g.BatchCount, g.M)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, mem.Free(a)) }()
	b, err := mem.Alloc(g.DType, g.BatchCount, g.N)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, mem.Free(b)) }()
	g.K, g.TransA, g.TransB, g.LDA, g.LDB = 1, false, false, 1, g.N
	if g.BatchCount > 1 {
		g.StrideA, g.StrideB = g.M, g.N
	}
	o.A, o.B = a, b
	return k.Gemm(g, o)
}

// rowSums computes BGrad's Bias[M] = Σ over k of op(A)[i, k] for an N = 0
// GEMM: Bias viewed as M×1 = op(A)·ones[K×1].
func rowSums(k Kernels, mem tensor.Memory, g GemmParams, o GemmOperands) (err error) {
	ones, err := mem.Alloc(g.DType, g.K)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, mem.Free(ones)) }()
	if err := mem.Write(ones, 0, tensor.HostBytes(Ones(g.DType, g.K)), tensor.Transfer); err != nil {
		return err
	}
	p := GemmParams{TransA: g.TransA, M: g.M, N: 1, K: g.K, Alpha: 1, LDA: g.LDA, LDB: 1, LDC: 1,
		DType: g.DType, OutDType: g.OutDType}.Normalized()
	return k.Gemm(p, GemmOperands{A: o.A, B: ones, C: o.Bias})
}

// Ones is a host vector of n ones of dtype dt.
func Ones(dt tensor.DType, n int) *tensor.Tensor {
	var t *tensor.Tensor
	var err error
	switch dt {
	case tensor.Float32:
		t, err = tensor.FromFloat32(slices.Repeat([]float32{1}, n), n)
	case tensor.BFloat16:
		t, err = tensor.FromBFloat16(slices.Repeat([]tensor.BF16{tensor.ToBF16(1)}, n), n)
	default:
		t, err = tensor.FromFloat64(slices.Repeat([]float64{1}, n), n)
	}
	if err != nil {
		panic(err) // a length and its slice: cannot disagree
	}
	return t
}
