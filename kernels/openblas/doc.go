// Package openblas is the "openblas" kernels provider: OpenBLAS's CBLAS (cgo,
// Debian's libopenblas-dev) for GEMM and GEMV, for comparison with the cpu
// provider. It is built only with the openblas build tag; it implements the
// GEMM-shaped ops and leaves the bias gradient and GELU to the cpu provider (the
// dispatcher falls back and logs it once).
//
// OpenBLAS's thread count is process-wide; New sets it.
package openblas
