//go:build cuda

package cuda

/*
#cgo LDFLAGS: -lcublasLt
#include <stdint.h>
#include <stddef.h>
#include <cublasLt.h>

// lt_gemm runs one column-major GEMM D = alpha·op(A)·op(B) + beta·C (D is C)
// with cuBLASLt: A and B of type ab, C of type c, float32 compute and scale, an
// optional bias epilogue (bias of type c, one per row of C). The algorithm is
// cuBLASLt's first heuristic pick for the workspace given. Addresses are device
// addresses; the call runs on the default stream of the current context.
static cublasStatus_t lt_gemm(cublasLtHandle_t h, int transa, int transb, uint64_t m, uint64_t n, uint64_t k,
		float alpha, uint64_t a, int64_t lda, uint64_t b, int64_t ldb, float beta, uint64_t c, int64_t ldc,
		cudaDataType_t ab, cudaDataType_t ct, uint64_t bias, uint64_t ws, size_t wsSize) {
	cublasLtMatmulDesc_t op = NULL;
	cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
	cublasLtMatmulPreference_t pref = NULL;
	cublasStatus_t st;
	cublasOperation_t ta = transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
	st = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
	if (st != CUBLAS_STATUS_SUCCESS) goto done;
	cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
	cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
	if (bias != 0) {
		cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
		void *bp = (void *)(uintptr_t)bias;
		cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
		cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp));
		cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ct, sizeof(ct));
	}
	st = cublasLtMatrixLayoutCreate(&la, ab, transa ? k : m, transa ? m : k, lda);
	if (st != CUBLAS_STATUS_SUCCESS) goto done;
	st = cublasLtMatrixLayoutCreate(&lb, ab, transb ? n : k, transb ? k : n, ldb);
	if (st != CUBLAS_STATUS_SUCCESS) goto done;
	st = cublasLtMatrixLayoutCreate(&lc, ct, m, n, ldc);
	if (st != CUBLAS_STATUS_SUCCESS) goto done;
	st = cublasLtMatmulPreferenceCreate(&pref);
	if (st != CUBLAS_STATUS_SUCCESS) goto done;
	cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsSize, sizeof(wsSize));
	cublasLtMatmulHeuristicResult_t res;
	int found = 0;
	st = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &res, &found);
	if (st != CUBLAS_STATUS_SUCCESS) goto done;
	if (found == 0) { st = CUBLAS_STATUS_NOT_SUPPORTED; goto done; }
	st = cublasLtMatmul(h, op, &alpha, (const void *)(uintptr_t)a, la, (const void *)(uintptr_t)b, lb, &beta,
		(const void *)(uintptr_t)c, lc, (void *)(uintptr_t)c, lc, &res.algo, (void *)(uintptr_t)ws, wsSize, 0);
done:
	if (pref) cublasLtMatmulPreferenceDestroy(pref);
	if (lc) cublasLtMatrixLayoutDestroy(lc);
	if (lb) cublasLtMatrixLayoutDestroy(lb);
	if (la) cublasLtMatrixLayoutDestroy(la);
	if (op) cublasLtMatmulDescDestroy(op);
	return st;
}
*/
import "C"

import (
	"fmt"

	"gorgonia.org/cu"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// ltWorkspace is the cuBLASLt workspace every GEMM may use.
const ltWorkspace = 32 << 20

// lt is the provider's cuBLASLt handle and workspace, made on first use
// (inside do).
type lt struct {
	h  C.cublasLtHandle_t
	ws cu.DevicePtr
}

func (p *Provider) ltHandle() (*lt, error) {
	if p.lt != nil {
		return p.lt, nil
	}
	l := &lt{}
	if st := C.cublasLtCreate(&l.h); st != C.CUBLAS_STATUS_SUCCESS {
		return nil, fmt.Errorf("cuda: cublasLtCreate: status %d", int(st))
	}
	ws, err := cu.MemAlloc(ltWorkspace)
	if err != nil {
		C.cublasLtDestroy(l.h)
		return nil, fmt.Errorf("cuda: cuBLASLt workspace: %w", err)
	}
	l.ws = ws
	p.lt = l
	return l, nil
}

// closeLt releases the handle and workspace (inside the context).
func (p *Provider) closeLt() error {
	if p.lt == nil {
		return nil
	}
	C.cublasLtDestroy(p.lt.h)
	err := cu.MemFree(p.lt.ws)
	p.lt = nil
	return err
}

func ltType(dt tensor.DType) C.cudaDataType_t {
	switch dt {
	case tensor.BFloat16:
		return C.CUDA_R_16BF
	case tensor.Float64:
		return C.CUDA_R_64F
	}
	return C.CUDA_R_32F
}

// gemmLt runs a checked row-major bfloat16 GEMM (no epilogue or the bias one)
// with cuBLASLt, float32 accumulation (inside do). Row-major C = op(A)·op(B) is
// column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: the operands swap, and the bias (one per
// column of C) is one per row of Cᵀ, as cuBLASLt's bias epilogue adds it.
func (p *Provider) gemmLt(g kernels.GemmParams, o kernels.GemmOperands) error {
	if g.M == 0 || g.N == 0 {
		return nil
	}
	l, err := p.ltHandle()
	if err != nil {
		return err
	}
	addr := func(t *tensor.Tensor) C.uint64_t {
		if t == nil {
			return 0
		}
		return C.uint64_t(t.Buffer().(*Buffer).ptr)
	}
	var bias C.uint64_t
	if g.Epilogue == kernels.EpilogueBias {
		bias = addr(o.Bias)
	}
	tr := func(b bool) C.int {
		if b {
			return 1
		}
		return 0
	}
	st := C.lt_gemm(l.h, tr(g.TransB), tr(g.TransA), C.uint64_t(g.N), C.uint64_t(g.M), C.uint64_t(g.K),
		C.float(g.Alpha), addr(o.B), C.int64_t(g.LDB), addr(o.A), C.int64_t(g.LDA), C.float(g.Beta), addr(o.C), C.int64_t(g.LDC),
		ltType(g.DType), ltType(g.Out()), bias, C.uint64_t(l.ws), C.size_t(ltWorkspace))
	if st != C.CUBLAS_STATUS_SUCCESS {
		return fmt.Errorf("cuda: cublasLtMatmul %v -> %v (%dx%dx%d): status %d", g.DType, g.Out(), g.M, g.N, g.K, int(st))
	}
	return nil
}
