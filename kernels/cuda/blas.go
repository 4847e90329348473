//go:build cuda

package cuda

/*
#cgo LDFLAGS: -lcublas
#include <stdint.h>
#include <cublas_v2.h>

// The cuBLAS calls the provider makes, on device addresses, its handle bound
// to the provider's stream (cublasSetStream) and the default host pointer
// mode (alpha and beta are read before the call returns).

static cublasStatus_t mr_blas_create(cublasHandle_t *h, uint64_t stream) {
	cublasStatus_t st = cublasCreate(h);
	if (st != CUBLAS_STATUS_SUCCESS) return st;
	st = cublasSetStream(*h, (cudaStream_t)(uintptr_t)stream);
	if (st != CUBLAS_STATUS_SUCCESS) { cublasDestroy(*h); *h = NULL; }
	return st;
}

static cublasStatus_t mr_blas_destroy(cublasHandle_t h) { return cublasDestroy(h); }

// mr_gemm: column-major C = alpha·op(A)·op(B) + beta·C for batch matrices
// at the given strides (elements), A and B of type ab, C of type c, computed
// as compute (float32 or float64 scalars to match).
static cublasStatus_t mr_gemm(cublasHandle_t h, int ta, int tb, int m, int n, int k, double alpha,
		uint64_t a, int lda, long long sa, uint64_t b, int ldb, long long sb, double beta,
		uint64_t c, int ldc, long long sc, int batch, int ab, int ct, int compute) {
	float af = (float)alpha, bf = (float)beta;
	const void *pa = &af, *pb = &bf;
	if (compute == CUBLAS_COMPUTE_64F) { pa = &alpha; pb = &beta; }
	return cublasGemmStridedBatchedEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, pa,
		(const void *)(uintptr_t)a, (cudaDataType_t)ab, lda, sa, (const void *)(uintptr_t)b, (cudaDataType_t)ab, ldb, sb, pb,
		(void *)(uintptr_t)c, (cudaDataType_t)ct, ldc, sc, batch, (cublasComputeType_t)compute, CUBLAS_GEMM_DEFAULT);
}

static cublasStatus_t mr_gemv(cublasHandle_t h, int f64, int trans, int m, int n, double alpha, uint64_t a, int lda,
		uint64_t x, double beta, uint64_t y) {
	cublasOperation_t t = trans ? CUBLAS_OP_T : CUBLAS_OP_N;
	if (f64) return cublasDgemv(h, t, m, n, &alpha, (const double *)(uintptr_t)a, lda, (const double *)(uintptr_t)x, 1, &beta, (double *)(uintptr_t)y, 1);
	float af = (float)alpha, bf = (float)beta;
	return cublasSgemv(h, t, m, n, &af, (const float *)(uintptr_t)a, lda, (const float *)(uintptr_t)x, 1, &bf, (float *)(uintptr_t)y, 1);
}

static cublasStatus_t mr_axpy(cublasHandle_t h, int f64, int n, double alpha, uint64_t x, uint64_t y) {
	if (f64) return cublasDaxpy(h, n, &alpha, (const double *)(uintptr_t)x, 1, (double *)(uintptr_t)y, 1);
	float af = (float)alpha;
	return cublasSaxpy(h, n, &af, (const float *)(uintptr_t)x, 1, (float *)(uintptr_t)y, 1);
}

static cublasStatus_t mr_scal(cublasHandle_t h, int f64, int n, double alpha, uint64_t x) {
	if (f64) return cublasDscal(h, n, &alpha, (double *)(uintptr_t)x, 1);
	float af = (float)alpha;
	return cublasSscal(h, n, &af, (float *)(uintptr_t)x, 1);
}
*/
import "C"

import (
	"fmt"
	"math"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// blasHandle is the provider's cuBLAS handle, bound to its stream.
type blasHandle struct{ h C.cublasHandle_t }

// newBLAS makes the handle (inside the context).
func newBLAS(stream uintptr) (*blasHandle, error) {
	b := &blasHandle{}
	if st := C.mr_blas_create(&b.h, C.uint64_t(stream)); st != C.CUBLAS_STATUS_SUCCESS {
		return nil, fmt.Errorf("cuda: cublasCreate: status %d", int(st))
	}
	return b, nil
}

func (b *blasHandle) close() error {
	if b == nil {
		return nil
	}
	if st := C.mr_blas_destroy(b.h); st != C.CUBLAS_STATUS_SUCCESS {
		return fmt.Errorf("cuda: cublasDestroy: status %d", int(st))
	}
	return nil
}

func blasErr(call string, st C.cublasStatus_t) error {
	if st == C.CUBLAS_STATUS_SUCCESS {
		return nil
	}
	return fmt.Errorf("cuda: %s: cuBLAS status %d", call, int(st))
}

// int32s checks that cuBLAS's int arguments hold the sizes.
func int32s(vs ...int) error {
	for _, v := range vs {
		if v > math.MaxInt32 {
			return fmt.Errorf("%w: cuda: dimension %d over cuBLAS's int", kernels.ErrShape, v)
		}
	}
	return nil
}

// gemm runs a checked row-major GEMM, every batch in one call, on cuBLAS
// (inside do): A and B of g.DType at addresses a and b, C of g.Out() at c.
// Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: the
// operands swap. Float32 and bfloat16 accumulate in float32 (TF32 only
// with Options.TF32), float64 in float64.
func (p *Provider) gemm(g kernels.GemmParams, a, b, c uint64) error {
	if g.M == 0 || g.N == 0 || g.K == 0 {
		return fmt.Errorf("cuda: internal: an empty GEMM %dx%dx%d reached cuBLAS", g.M, g.N, g.K)
	}
	if err := int32s(g.M, g.N, g.K, g.LDA, g.LDB, g.LDC, g.BatchCount); err != nil {
		return err
	}
	compute := C.CUBLAS_COMPUTE_32F
	switch {
	case g.DType == tensor.Float64:
		compute = C.CUBLAS_COMPUTE_64F
	case g.DType == tensor.Float32 && g.Out() == tensor.Float32 && p.opts.TF32:
		compute = C.CUBLAS_COMPUTE_32F_FAST_TF32
	}
	st := C.mr_gemm(p.blas.h, tr(g.TransB), tr(g.TransA), C.int(g.N), C.int(g.M), C.int(g.K), C.double(g.Alpha),
		C.uint64_t(b), C.int(g.LDB), C.longlong(g.StrideB), C.uint64_t(a), C.int(g.LDA), C.longlong(g.StrideA), C.double(g.Beta),
		C.uint64_t(c), C.int(g.LDC), C.longlong(g.StrideC), C.int(g.BatchCount), C.int(dataType(g.DType)), C.int(dataType(g.Out())), C.int(compute))
	if err := blasErr("cublasGemmStridedBatchedEx", st); err != nil {
		return fmt.Errorf("%w (%v -> %v, %dx%dx%d, %d batches)", err, g.DType, g.Out(), g.M, g.N, g.K, g.BatchCount)
	}
	return nil
}

// dataType is cuBLAS's name of dt.
func dataType(dt tensor.DType) C.cudaDataType_t {
	switch dt {
	case tensor.BFloat16:
		return C.CUDA_R_16BF
	case tensor.Float64:
		return C.CUDA_R_64F
	}
	return C.CUDA_R_32F
}

func tr(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// gemv runs a checked row-major GEMV (inside do): the row-major M×N matrix
// is the column-major N×M matrix Aᵀ, so the transpose flag flips.
func (p *Provider) gemv(g kernels.GemvParams, a, x, y *tensor.Tensor) error {
	_, lx, ly := g.Lens()
	if ly == 0 {
		return nil
	}
	if lx == 0 {
		return p.scale(y, ly, g.Beta)
	}
	if err := int32s(g.M, g.N, g.LDA); err != nil {
		return err
	}
	st := C.mr_gemv(p.blas.h, f64(g.DType), tr(!g.Trans), C.int(g.N), C.int(g.M), C.double(g.Alpha), C.uint64_t(dev(a)), C.int(g.LDA),
		C.uint64_t(dev(x)), C.double(g.Beta), C.uint64_t(dev(y)))
	return blasErr("gemv", st)
}

func f64(dt tensor.DType) C.int {
	if dt == tensor.Float64 {
		return 1
	}
	return 0
}

// scale sets y[:n] = beta·y[:n] (0 without reading it when beta is 0).
func (p *Provider) scale(y *tensor.Tensor, n int, beta float64) error {
	if beta == 0 {
		return p.memset(dev(y), n*y.DType().Size())
	}
	return blasErr("scal", C.mr_scal(p.blas.h, f64(y.DType()), C.int(n), C.double(beta), C.uint64_t(dev(y))))
}

// axpy runs y += alpha·x on n float32 or float64 elements (inside do).
func (p *Provider) axpy(dt tensor.DType, n int, alpha float64, x, y uint64) error {
	if err := int32s(n); err != nil {
		return err
	}
	return blasErr("axpy", C.mr_axpy(p.blas.h, f64(dt), C.int(n), C.double(alpha), C.uint64_t(x), C.uint64_t(y)))
}
