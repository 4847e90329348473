// Package kernels describes the local compute a rank runs (GEMM, GEMV, the linear
// layer's forward and its three backward ops, batched matmul, GELU) and dispatches
// it to providers registered by name: "cpu" (kernels/cpu, pure Go and Go assembly,
// always built), "openblas" (kernels/openblas, build tag openblas) and "cuda"
// (kernels/cuda, build tag cuda).
//
// All matrices are row-major. A Dispatcher, built from a Registry and an explicit
// Choice, routes each op on each device to one provider; there is no global
// current provider.
package kernels

import (
	"fmt"

	"github.com/meshrun/meshrun/tensor"
)

// GemmParams describes a (strided, batched) row-major GEMM and nothing else: no
// device, stream or handle. For each batch index i < max(BatchCount, 1):
//
//	C_i = Alpha * op(A_i) * op(B_i) + Beta * C_i
//
// where op(A_i) is M×K and op(B_i) is K×N, A_i starts at element i*StrideA of A,
// and so on. If TransA is false A_i is stored as M rows of LDA elements (LDA >= K),
// otherwise as K rows of LDA elements (LDA >= M); likewise B_i is K rows (N rows
// when TransB) of LDB elements, and C_i is M rows of LDC elements (LDC >= N).
// A zero leading dim means the tight one. Beta = 0 means C is not read (NaN in C
// does not propagate); Alpha = 0 or K = 0 means A and B are not read.
type GemmParams struct {
	TransA, TransB bool
	M, N, K        int
	Alpha, Beta    float64
	LDA, LDB, LDC  int
	// BatchCount is the number of GEMMs (0 or 1 means one); strides are in elements.
	BatchCount                int
	StrideA, StrideB, StrideC int
	DType                     tensor.DType
}

// Normalized returns p with defaults filled in: tight leading dims, BatchCount >= 1,
// and tight batch strides where a stride is 0 and BatchCount > 1.
func (p GemmParams) Normalized() GemmParams {
	ar, ac := p.M, p.K
	if p.TransA {
		ar, ac = p.K, p.M
	}
	br, bc := p.K, p.N
	if p.TransB {
		br, bc = p.N, p.K
	}
	if p.LDA == 0 {
		p.LDA = max(ac, 1)
	}
	if p.LDB == 0 {
		p.LDB = max(bc, 1)
	}
	if p.LDC == 0 {
		p.LDC = max(p.N, 1)
	}
	if p.BatchCount < 1 {
		p.BatchCount = 1
	}
	if p.BatchCount > 1 {
		if p.StrideA == 0 {
			p.StrideA = ar * p.LDA
		}
		if p.StrideB == 0 {
			p.StrideB = br * p.LDB
		}
		if p.StrideC == 0 {
			p.StrideC = p.M * p.LDC
		}
	}
	return p
}

// Validate reports every problem of a normalized description at once.
func (p GemmParams) Validate() error {
	var errs []string
	if p.M < 0 || p.N < 0 || p.K < 0 {
		errs = append(errs, fmt.Sprintf("negative size M=%d N=%d K=%d", p.M, p.N, p.K))
	}
	ac, bc := p.K, p.N
	if p.TransA {
		ac = p.M
	}
	if p.TransB {
		bc = p.K
	}
	if p.LDA < max(ac, 1) {
		errs = append(errs, fmt.Sprintf("LDA=%d < %d", p.LDA, max(ac, 1)))
	}
	if p.LDB < max(bc, 1) {
		errs = append(errs, fmt.Sprintf("LDB=%d < %d", p.LDB, max(bc, 1)))
	}
	if p.LDC < max(p.N, 1) {
		errs = append(errs, fmt.Sprintf("LDC=%d < %d", p.LDC, max(p.N, 1)))
	}
	if p.BatchCount < 1 || p.StrideA < 0 || p.StrideB < 0 || p.StrideC < 0 {
		errs = append(errs, fmt.Sprintf("bad batch %d strides %d/%d/%d", p.BatchCount, p.StrideA, p.StrideB, p.StrideC))
	}
	if p.DType != tensor.Float32 && p.DType != tensor.Float64 {
		errs = append(errs, fmt.Sprintf("dtype %v", p.DType))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: gemm %v", ErrShape, errs)
}

// Lens returns the minimum number of elements A, B and C must hold.
func (p GemmParams) Lens() (la, lb, lc int) {
	span := func(rows, cols, ld, stride int) int {
		if rows == 0 || cols == 0 {
			return 0
		}
		return (p.BatchCount-1)*stride + (rows-1)*ld + cols
	}
	ar, ac := p.M, p.K
	if p.TransA {
		ar, ac = p.K, p.M
	}
	br, bc := p.K, p.N
	if p.TransB {
		br, bc = p.N, p.K
	}
	return span(ar, ac, p.LDA, p.StrideA), span(br, bc, p.LDB, p.StrideB), span(p.M, p.N, p.LDC, p.StrideC)
}

// Flops returns the floating-point operations of the GEMM (2*M*N*K per batch).
func (p GemmParams) Flops() float64 {
	return 2 * float64(p.M) * float64(p.N) * float64(p.K) * float64(max(p.BatchCount, 1))
}

// GemvParams describes y = Alpha * op(A) * x + Beta * y for a row-major M×N matrix
// A with leading dim LDA (>= N; 0 means N). op(A) is A (x has N elements, y has M)
// or, with Trans, Aᵀ (x has M elements, y has N). Beta = 0 means y is not read.
type GemvParams struct {
	Trans       bool
	M, N        int
	Alpha, Beta float64
	LDA         int
	DType       tensor.DType
}

// Normalized fills in the default leading dim.
func (p GemvParams) Normalized() GemvParams {
	if p.LDA == 0 {
		p.LDA = max(p.N, 1)
	}
	return p
}

// Validate reports what is wrong with a normalized description.
func (p GemvParams) Validate() error {
	if p.M < 0 || p.N < 0 || p.LDA < max(p.N, 1) {
		return fmt.Errorf("%w: gemv M=%d N=%d LDA=%d", ErrShape, p.M, p.N, p.LDA)
	}
	if p.DType != tensor.Float32 && p.DType != tensor.Float64 {
		return fmt.Errorf("%w: gemv %v", ErrDType, p.DType)
	}
	return nil
}

// Lens returns the minimum number of elements of A, x and y.
func (p GemvParams) Lens() (la, lx, ly int) {
	if p.M > 0 && p.N > 0 {
		la = (p.M-1)*p.LDA + p.N
	}
	if p.Trans {
		return la, p.M, p.N
	}
	return la, p.N, p.M
}
