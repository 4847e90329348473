// Package kernels describes the local compute a rank runs and dispatches it to
// providers registered by name: "cpu" (kernels/cpu, pure Go and Go assembly,
// always built), "sim" (kernels/sim: the cpu kernels on simulated device memory),
// "openblas" (kernels/openblas, build tag openblas) and "cuda" (kernels/cuda,
// build tag cuda).
//
// What differs per provider is small (Kernels): one GEMM described by GemmParams,
// epilogue included (bias, GELU keeping the pre-activation, the GELU gradient,
// bias gradients), GEMV, and a few elementwise ops. The linear layer's forward
// and its three backward ops, and batched matmul, are lowered onto those here,
// once (LinearForward, LinearBackwardInput, ...).
//
// All matrices are row-major. A Dispatcher, built from a Registry and an explicit
// Choice, serves one device: it routes each op to one provider and allocates the
// rank's tensors in that device's memory; there is no global current provider.
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
	// DType is the element type of A and B; OutDType that of C, Bias and Aux
	// (0: DType). Supported: float32, float64, bfloat16 in and out, and
	// bfloat16 in with float32 out (a weight gradient accumulated in float32).
	// bfloat16 GEMMs multiply exactly and accumulate in float32.
	DType, OutDType tensor.DType
	// Epilogue is what the GEMM does with its result (EpilogueNone: nothing).
	// Epilogues other than EpilogueNone take one GEMM (BatchCount 1).
	Epilogue Epilogue
}

// Epilogue is work fused into a GEMM's output, as cuBLASLt's epilogues: with
// R = Alpha·op(A)·op(B) + Beta·C (C[M, N], leading dim LDC):
//
//	EpilogueNone        C = R
//	EpilogueBias        C = R + Bias              Bias[N] broadcast over rows
//	EpilogueBiasGelu    Aux = R + Bias; C = gelu(Aux)   Aux[M, N] (tight) keeps the
//	                    pre-activation for the backward
//	EpilogueDGelu       C = R ⊙ gelu'(Aux)        Aux[M, N] is the forward's
//	                    pre-activation
//	EpilogueDGeluBGrad  as EpilogueDGelu, and Bias[N] = Σ over rows of C (the
//	                    bias gradient of the layer before the GELU)
//	EpilogueBGrad       C = R, and Bias[M] = Σ over k of op(A)[i, k] (with
//	                    op(A) = dyᵀ: the bias gradient beside the weight gradient)
//
// Bias gradients overwrite Bias. GELU is the tanh approximation (see Gelu).
type Epilogue uint8

// The epilogues.
const (
	EpilogueNone Epilogue = iota
	EpilogueBias
	EpilogueBiasGelu
	EpilogueDGelu
	EpilogueDGeluBGrad
	EpilogueBGrad
	numEpilogues
)

var epilogueOps = [numEpilogues]Op{OpGemm, OpGemmBias, OpGemmBiasGelu, OpGemmDGelu, OpGemmDGeluBGrad, OpGemmBGrad}

// Op is the op a GEMM with this epilogue is dispatched as.
func (e Epilogue) Op() Op {
	if e < numEpilogues {
		return epilogueOps[e]
	}
	return numOps
}

func (e Epilogue) String() string {
	if e < numEpilogues {
		return epilogueOps[e].String()
	}
	return fmt.Sprintf("epilogue(%d)", uint8(e))
}

// UsesBias reports whether the epilogue reads or writes the Bias operand.
func (e Epilogue) UsesBias() bool {
	return e == EpilogueBias || e == EpilogueBiasGelu || e == EpilogueDGeluBGrad || e == EpilogueBGrad
}

// UsesAux reports whether the epilogue reads or writes the Aux operand.
func (e Epilogue) UsesAux() bool {
	return e == EpilogueBiasGelu || e == EpilogueDGelu || e == EpilogueDGeluBGrad
}

// BiasLen is the number of elements of the Bias operand (0: none).
func (p GemmParams) BiasLen() int {
	switch {
	case p.Epilogue == EpilogueBGrad:
		return p.M
	case p.Epilogue.UsesBias():
		return p.N
	}
	return 0
}

// AuxLen is the number of elements of the Aux operand (0: none).
func (p GemmParams) AuxLen() int {
	if p.Epilogue.UsesAux() {
		return p.M * p.N
	}
	return 0
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
	badType := !GemmDTypes(p.DType, p.Out())
	if badType {
		errs = append(errs, fmt.Sprintf("dtype %v -> %v", p.DType, p.Out()))
	}
	if p.Epilogue >= numEpilogues {
		errs = append(errs, p.Epilogue.String())
	} else if p.Epilogue != EpilogueNone && p.BatchCount != 1 {
		errs = append(errs, fmt.Sprintf("%v on a batch of %d", p.Epilogue, p.BatchCount))
	}
	if len(errs) == 0 {
		return nil
	}
	if badType {
		return fmt.Errorf("%w (%w): gemm %v", ErrShape, ErrDType, errs)
	}
	return fmt.Errorf("%w: gemm %v", ErrShape, errs)
}

// Out is the element type of C, Bias and Aux.
func (p GemmParams) Out() tensor.DType {
	if p.OutDType != 0 {
		return p.OutDType
	}
	return p.DType
}

// GemmDTypes reports whether a GEMM takes inputs of in and writes out.
func GemmDTypes(in, out tensor.DType) bool {
	switch in {
	case tensor.Float32, tensor.Float64:
		return out == in
	case tensor.BFloat16:
		return out == tensor.BFloat16 || out == tensor.Float32
	}
	return false
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
