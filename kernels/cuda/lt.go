//go:build cuda

package cuda

/*
#cgo LDFLAGS: -lcublasLt
#include <stdint.h>
#include <stddef.h>
#include <cublasLt.h>

// lt_gemm runs one column-major GEMM D = epilogue(alpha·op(A)·op(B) + beta·C)
// (D is C) with cuBLASLt: A and B of type ab, C of type c, float32 scale,
// float32 compute (tf32: TF32 tensor cores allowed). epi is a
// cublasLtEpilogue_t; bias (of type c) is the bias, or the bias gradient of
// the BGRAD epilogues; aux (type c, leading dimension ldaux) the GELU
// pre-activation the GELU_AUX epilogue writes and DGELU reads. *algo is the
// algorithm: when *have is 0, cuBLASLt's first heuristic pick for the
// workspace is written there and *have set (the caller caches it); *stage
// says where a failure came from (0: the descriptors or the heuristic, 1:
// the matmul). Addresses are device addresses; the call is queued on stream
// in the current context.
static cublasStatus_t lt_gemm(cublasLtHandle_t h, int transa, int transb, uint64_t m, uint64_t n, uint64_t k,
		float alpha, uint64_t a, int64_t lda, uint64_t b, int64_t ldb, float beta, uint64_t c, int64_t ldc,
		cudaDataType_t ab, cudaDataType_t ct, int tf32, int epi, uint64_t bias, uint64_t aux, int64_t ldaux,
		uint64_t ws, size_t wsSize, uint64_t stream, cublasLtMatmulAlgo_t *algo, int *have, int *stage) {
	cublasLtMatmulDesc_t op = NULL;
	cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
	cublasLtMatmulPreference_t pref = NULL;
	cublasStatus_t st;
	*stage = 0;
	cublasOperation_t ta = transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
	cublasComputeType_t compute = (tf32 && ab == CUDA_R_32F) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
	st = cublasLtMatmulDescCreate(&op, compute, CUDA_R_32F);
	if (st != CUBLAS_STATUS_SUCCESS) goto done;
	cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
	cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
	if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
		cublasLtEpilogue_t e = (cublasLtEpilogue_t)epi;
		cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof(e));
	}
	if (bias != 0) {
		void *bp = (void *)(uintptr_t)bias;
		cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp));
		cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ct, sizeof(ct));
	}
	if (aux != 0) {
		void *xp = (void *)(uintptr_t)aux;
		cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &xp, sizeof(xp));
		cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux, sizeof(ldaux));
	}
	st = cublasLtMatrixLayoutCreate(&la, ab, transa ? k : m, transa ? m : k, lda);
	if (st != CUBLAS_STATUS_SUCCESS) goto done;
	st = cublasLtMatrixLayoutCreate(&lb, ab, transb ? n : k, transb ? k : n, ldb);
	if (st != CUBLAS_STATUS_SUCCESS) goto done;
	st = cublasLtMatrixLayoutCreate(&lc, ct, m, n, ldc);
	if (st != CUBLAS_STATUS_SUCCESS) goto done;
	if (!*have) {
		st = cublasLtMatmulPreferenceCreate(&pref);
		if (st != CUBLAS_STATUS_SUCCESS) goto done;
		cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsSize, sizeof(wsSize));
		cublasLtMatmulHeuristicResult_t res;
		int found = 0;
		st = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, lc, lc, pref, 1, &res, &found);
		if (st != CUBLAS_STATUS_SUCCESS) goto done;
		if (found == 0) { st = CUBLAS_STATUS_NOT_SUPPORTED; goto done; }
		*algo = res.algo;
		*have = 1;
	}
	*stage = 1;
	st = cublasLtMatmul(h, op, &alpha, (const void *)(uintptr_t)a, la, (const void *)(uintptr_t)b, lb, &beta,
		(const void *)(uintptr_t)c, lc, (void *)(uintptr_t)c, lc, algo, (void *)(uintptr_t)ws, wsSize, (cudaStream_t)(uintptr_t)stream);
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
	"errors"
	"fmt"

	"gorgonia.org/cu"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// ltWorkspace is the cuBLASLt workspace every GEMM may use.
const ltWorkspace = 32 << 20

// lt is the provider's cuBLASLt handle, workspace and algorithm cache, made
// on first use (inside do).
type lt struct {
	h     C.cublasLtHandle_t
	ws    cu.DevicePtr
	algos map[ltKey]*ltAlgo
}

// ltKey is what cuBLASLt's heuristic depends on: shape, dtypes, layout,
// epilogue.
type ltKey struct {
	transA, transB         bool
	m, n, k, lda, ldb, ldc int
	ldaux                  int
	dt, out                tensor.DType
	epi                    kernels.Epilogue
	tf32, beta0            bool
}

// ltAlgo is a cached pick, or a refusal (the fallback runs then).
type ltAlgo struct {
	algo    C.cublasLtMatmulAlgo_t
	have    C.int
	used    bool // a matmul has run with it
	refused bool
}

func (p *Provider) ltHandle() (*lt, error) {
	if p.lt != nil {
		return p.lt, nil
	}
	l := &lt{algos: map[ltKey]*ltAlgo{}}
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

// ltEpilogue is the cuBLASLt epilogue of e (after the operand swap: the
// bias runs along the rows of the column-major result, BGRADB sums the
// second operand, op(A)ᵀ, over k).
func ltEpilogue(e kernels.Epilogue) C.int {
	switch e {
	case kernels.EpilogueBias:
		return C.CUBLASLT_EPILOGUE_BIAS
	case kernels.EpilogueBiasGelu:
		return C.CUBLASLT_EPILOGUE_GELU_AUX_BIAS
	case kernels.EpilogueDGelu:
		return C.CUBLASLT_EPILOGUE_DGELU
	case kernels.EpilogueDGeluBGrad:
		return C.CUBLASLT_EPILOGUE_DGELU_BGRAD
	case kernels.EpilogueBGrad:
		return C.CUBLASLT_EPILOGUE_BGRADB
	}
	return C.CUBLASLT_EPILOGUE_DEFAULT
}

// errLtRefused: cuBLASLt has no algorithm for the GEMM with its epilogue
// (e.g. an aux leading dimension not a multiple of 8); the caller falls back.
var errLtRefused = errors.New("cuda: cuBLASLt refused the GEMM")

// gemmLt runs a checked row-major GEMM (BatchCount 1) with its epilogue
// fused by cuBLASLt, float32 accumulation (inside do). Row-major C =
// op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: the operands swap. The
// algorithm is cuBLASLt's heuristic pick, made once per (shape, dtypes,
// layout, epilogue) and cached; a refusal is cached too (errLtRefused).
func (p *Provider) gemmLt(g kernels.GemmParams, o kernels.GemmOperands) error {
	l, err := p.ltHandle()
	if err != nil {
		return err
	}
	addr := func(t *tensor.Tensor) C.uint64_t {
		if t == nil {
			return 0
		}
		return C.uint64_t(dev(t))
	}
	tf32 := p.opts.TF32
	var bias, aux C.uint64_t
	ldaux := 0
	if g.Epilogue.UsesBias() {
		bias = addr(o.Bias)
	}
	if g.Epilogue.UsesAux() {
		aux, ldaux = addr(o.Aux), g.N
	}
	key := ltKey{g.TransA, g.TransB, g.M, g.N, g.K, g.LDA, g.LDB, g.LDC, ldaux, g.DType, g.Out(), g.Epilogue, tf32, g.Beta == 0}
	a := l.algos[key]
	if a == nil {
		a = &ltAlgo{}
		l.algos[key] = a
	}
	if a.refused {
		return errLtRefused
	}
	var stage C.int
	st := C.lt_gemm(l.h, tr(g.TransB), tr(g.TransA), C.uint64_t(g.N), C.uint64_t(g.M), C.uint64_t(g.K),
		C.float(g.Alpha), addr(o.B), C.int64_t(g.LDB), addr(o.A), C.int64_t(g.LDA), C.float(g.Beta), addr(o.C), C.int64_t(g.LDC),
		dataType(g.DType), dataType(g.Out()), tr(tf32), ltEpilogue(g.Epilogue), bias, aux, C.int64_t(ldaux),
		C.uint64_t(l.ws), C.size_t(ltWorkspace), C.uint64_t(p.Stream()), &a.algo, &a.have, &stage)
	switch {
	case st == C.CUBLAS_STATUS_SUCCESS:
		a.used = true
		return nil
	case !a.used && (st == C.CUBLAS_STATUS_NOT_SUPPORTED || st == C.CUBLAS_STATUS_INVALID_VALUE):
		// No algorithm for this GEMM and epilogue (the heuristic's answer), or
		// the first matmul with the pick refused it: cuBLAS and the kernels
		// serve it from now on.
		a.refused = true
		return errLtRefused
	}
	where := "cublasLtMatmul"
	if stage == 0 {
		where = "cublasLt descriptors and heuristic"
	}
	return fmt.Errorf("cuda: %s %v -> %v (%dx%dx%d, %v): status %d", where, g.DType, g.Out(), g.M, g.N, g.K, g.Epilogue, int(st))
}
