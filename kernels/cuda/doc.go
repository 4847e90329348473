// Package cuda is the "cuda" kernels provider: cuBLAS through gorgonia.org/cu/blas
// for GEMM and GEMV, gorgonia.org/cu for the context and device memory. It is
// built only with the cuda build tag (it needs cgo, the CUDA headers and, to run,
// the driver and libcublas). Row-major operands are handled by the operand swap:
// a row-major C = op(A)·op(B) is the column-major Cᵀ = op(B)ᵀ·op(A)ᵀ.
//
// Without the tag this package holds only what needs no GPU: the plans
// (plan.go) and the provider's Options.
package cuda
