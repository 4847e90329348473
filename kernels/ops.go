package kernels

import (
	"fmt"
	"slices"

	"github.com/meshrun/meshrun/tensor"
)

// Op names one kernel: a GEMM with each of its epilogues, GEMV, or an
// elementwise op. Providers say which they implement (Provider.Has).
type Op uint8

// The ops a provider may implement.
const (
	OpGemm Op = iota
	OpGemmBias
	OpGemmBiasGelu
	OpGemmDGelu
	OpGemmDGeluBGrad
	OpGemmBGrad
	OpGemv
	OpGeluForward
	OpGeluBackward
	OpBiasGrad
	OpAxpy
	OpMSE
	OpCast
	OpLayerNorm
	OpLayerNormBackward
	OpAttention
	OpAttentionBackward
	OpEmbedding
	OpEmbeddingBackward
	OpCrossEntropy
	OpCrossEntropyBackward
	OpCrossEntropyCombine
	OpAdamW
	OpGroupedGemm
	numOps
)

var opNames = [numOps]string{
	"gemm", "gemm_bias", "gemm_bias_gelu", "gemm_dgelu", "gemm_dgelu_bgrad", "gemm_bgrad",
	"gemv", "gelu_forward", "gelu_backward", "bias_grad", "axpy", "mse", "cast",
	"layernorm", "layernorm_backward", "attention", "attention_backward", "embedding", "embedding_backward",
	"cross_entropy", "cross_entropy_backward", "cross_entropy_combine", "adamw", "grouped_gemm",
}

func (o Op) String() string {
	if o < numOps {
		return opNames[o]
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Ops returns every op, in order.
func Ops() []Op {
	ops := make([]Op, numOps)
	for i := range ops {
		ops[i] = Op(i)
	}
	return ops
}

// ParseOp returns the op with the given name (as printed by Op.String).
func ParseOp(s string) (Op, error) {
	if i := slices.Index(opNames[:], s); i >= 0 {
		return Op(i), nil
	}
	return 0, fmt.Errorf("%w: %q", ErrUnknownOp, s)
}

// GemmOperands are the tensors of one GEMM: A, B and C always; Bias and Aux as
// the epilogue needs them (see Epilogue).
type GemmOperands struct {
	A, B, C   *tensor.Tensor
	Bias, Aux *tensor.Tensor
}

// Kernels is what differs per provider: one GEMM with its epilogue, GEMV, and
// the elementwise ops. Every op is a pure computation on its operands, all on
// one device: it writes only its outputs, holds no autograd state, and decides
// nothing about which gradients are needed. The linear layer's and batched
// matmul's ops are lowered onto these once (LinearForward, MatmulForward...),
// not once per provider.
//
//	Gemm          see GemmParams and Epilogue
//	GroupedGemm   one linear GEMM per expert on a packed buffer: see GroupedParams
//	Gemv          see GemvParams
//	GeluForward   y = gelu(x), tanh approximation (PyTorch approximate="tanh")
//	GeluBackward  dx = dy * gelu'(x)
//	BiasGrad      db[N] (+)= Σ over rows of dy[..., N]
//	Axpy          y += alpha·x (the SGD update, alpha = -lr)
//	MSE           dy = scale·(y − target); sum[0] = Σ (y − target)², accumulated
//	              in float64 in a fixed order (sum is a 1-element float64 tensor
//	              on the same device)
//	Cast          dst = src in dst's dtype (same shape; narrowing to bfloat16
//	              rounds to nearest even)
//
// bfloat16 operands are computed in float32: GEMMs multiply exactly and
// accumulate in float32, elementwise ops widen, compute and round once. A
// bfloat16 dy may have a float32 db (BiasGrad).
//
// (+)= means the result is added to the output when accumulate is true and
// overwrites it (without reading it) otherwise.
type Kernels interface {
	Gemm(p GemmParams, o GemmOperands) error
	GroupedGemm(p GroupedParams, o GemmOperands) error
	Gemv(p GemvParams, a, x, y *tensor.Tensor) error
	GeluForward(y, x *tensor.Tensor) error
	GeluBackward(dx, dy, x *tensor.Tensor) error
	BiasGrad(db, dy *tensor.Tensor, accumulate bool) error
	Axpy(alpha float64, x, y *tensor.Tensor) error
	MSE(dy, sum, y, target *tensor.Tensor, scale float64) error
	Cast(dst, src *tensor.Tensor) error
	TransformerKernels
}

// Provider is one implementation of the ops on one kind of device. A provider
// that does not implement an op reports Has(op) == false (its method then returns
// ErrUnsupported) and the Dispatcher sends that op to the device's default
// provider instead.
type Provider interface {
	Kernels
	// Name is the name the provider is registered under.
	Name() string
	// Device is the kind of device whose tensors the provider computes on.
	Device() tensor.DeviceKind
	// Has reports whether the provider implements op.
	Has(op Op) bool
	// DTypes lists the element types its kernels take.
	DTypes() []tensor.DType
}

// MemoryProvider is a provider that owns its device's memory: the default
// provider of each device (cpu, sim, cuda) is one.
type MemoryProvider interface {
	Provider
	Memory() tensor.Memory
}

// Compute is a rank's compute device: the kernels and the memory they run on.
// The Dispatcher is one.
type Compute interface {
	Kernels
	tensor.Memory
}

// DeviceMemory is c's memory as its provider made it (the cuda or sim
// Memory, with its stream, context and device identity, which a collective
// library needs), through a Dispatcher and any wrapper that says what it
// wraps (a DeviceMemory method); c itself otherwise.
func DeviceMemory(c Compute) tensor.Memory {
	if d, ok := c.(interface{ DeviceMemory() tensor.Memory }); ok {
		return d.DeviceMemory()
	}
	return c
}

// LinearDims checks the shapes of LinearForward's operands (b may be nil) and
// returns the problem sizes: M rows of x, N outputs, K inputs. (Their dtypes are
// the GEMM's to check: CheckGemm.)
func LinearDims(y, x, w, b *tensor.Tensor) (m, n, k int, err error) {
	if x.Rank() < 1 || w.Rank() != 2 || y.Rank() != x.Rank() {
		return 0, 0, 0, fmt.Errorf("%w: linear y=%v x=%v w=%v", ErrShape, y, x, w)
	}
	n, k = w.Dim(0), w.Dim(1)
	m = lead(x)
	ok := x.Dim(-1) == k && y.Dim(-1) == n
	for i := 0; i < x.Rank()-1; i++ {
		ok = ok && x.Dim(i) == y.Dim(i)
	}
	if b != nil && (b.Rank() != 1 || b.Dim(0) != n) {
		ok = false
	}
	if !ok {
		return 0, 0, 0, fmt.Errorf("%w: linear y=%v x=%v w=%v b=%v", ErrShape, y, x, w, b)
	}
	return m, n, k, nil
}

// BiasDims checks LinearBackwardBias operands and returns (rows, N).
func BiasDims(db, dy *tensor.Tensor) (m, n int, err error) {
	if db.Rank() != 1 || dy.Rank() < 1 || dy.Dim(-1) != db.Dim(0) {
		return 0, 0, fmt.Errorf("%w: linear bias db=%v dy=%v", ErrShape, db, dy)
	}
	n = db.Dim(0)
	m = lead(dy)
	if err := sameDType(db); err != nil {
		return 0, 0, err
	}
	if err := sameDType(dy); err != nil {
		return 0, 0, err
	}
	if db.DType() != dy.DType() && !(dy.DType() == tensor.BFloat16 && db.DType() == tensor.Float32) {
		return 0, 0, fmt.Errorf("%w: bias gradient of %v into %v", ErrDType, dy.DType(), db.DType())
	}
	return m, n, nil
}

// LinearForwardGemm is the GEMM of LinearForward: y[M,N] = x[M,K]·w[N,K]ᵀ, with
// the bias epilogue when bias is true.
func LinearForwardGemm(m, n, k int, bias bool, dt tensor.DType) GemmParams {
	p := GemmParams{TransB: true, M: m, N: n, K: k, Alpha: 1, DType: dt}
	if bias {
		p.Epilogue = EpilogueBias
	}
	return p.Normalized()
}

// LinearBackwardInputGemm is dx[M,K] = dy[M,N]·w[N,K].
func LinearBackwardInputGemm(m, n, k int, dt tensor.DType) GemmParams {
	return GemmParams{M: m, N: k, K: n, Alpha: 1, DType: dt}.Normalized()
}

// LinearBackwardWeightGemm is dw[N,K] (+)= dy[M,N]ᵀ·x[M,K].
func LinearBackwardWeightGemm(m, n, k int, accumulate bool, dt tensor.DType) GemmParams {
	return GemmParams{TransA: true, M: n, N: k, K: m, Alpha: 1, Beta: betaOf(accumulate), DType: dt}.Normalized()
}

// MatmulDims checks c = a·b operands (rank 2, or rank 3 with equal batch) and
// returns batch, M, N, K.
func MatmulDims(c, a, b *tensor.Tensor) (batch, m, n, k int, err error) {
	r := a.Rank()
	if (r != 2 && r != 3) || b.Rank() != r || c.Rank() != r {
		return 0, 0, 0, 0, fmt.Errorf("%w: matmul c=%v a=%v b=%v", ErrShape, c, a, b)
	}
	batch = 1
	if r == 3 {
		batch = a.Dim(0)
		if b.Dim(0) != batch || c.Dim(0) != batch {
			return 0, 0, 0, 0, fmt.Errorf("%w: matmul batch c=%v a=%v b=%v", ErrShape, c, a, b)
		}
	}
	m, k, n = a.Dim(-2), a.Dim(-1), b.Dim(-1)
	if b.Dim(-2) != k || c.Dim(-2) != m || c.Dim(-1) != n {
		return 0, 0, 0, 0, fmt.Errorf("%w: matmul c=%v a=%v b=%v", ErrShape, c, a, b)
	}
	return batch, m, n, k, sameDType(c, a, b)
}

// MatmulForwardGemm is c[B,M,N] = a[B,M,K]·b[B,K,N].
func MatmulForwardGemm(batch, m, n, k int, dt tensor.DType) GemmParams {
	return GemmParams{M: m, N: n, K: k, Alpha: 1, BatchCount: batch, DType: dt}.Normalized()
}

// MatmulBackwardInputGemm is da[B,M,K] (+)= dc[B,M,N]·b[B,K,N]ᵀ.
func MatmulBackwardInputGemm(batch, m, n, k int, accumulate bool, dt tensor.DType) GemmParams {
	return GemmParams{TransB: true, M: m, N: k, K: n, Alpha: 1, Beta: betaOf(accumulate), BatchCount: batch, DType: dt}.Normalized()
}

// MatmulBackwardOtherGemm is db[B,K,N] (+)= a[B,M,K]ᵀ·dc[B,M,N].
func MatmulBackwardOtherGemm(batch, m, n, k int, accumulate bool, dt tensor.DType) GemmParams {
	return GemmParams{TransA: true, M: k, N: n, K: m, Alpha: 1, Beta: betaOf(accumulate), BatchCount: batch, DType: dt}.Normalized()
}

// ElementwiseDims checks that all operands have the same shape and dtype and
// returns the element count.
func ElementwiseDims(out *tensor.Tensor, in ...*tensor.Tensor) (int, error) {
	for _, t := range in {
		if !tensor.SameShape(t, out) {
			return 0, fmt.Errorf("%w: elementwise %v vs %v", ErrShape, out, t)
		}
		if err := sameDType(out, t); err != nil {
			return 0, err
		}
	}
	return out.Len(), sameDType(out)
}

// lead returns the product of all dims but the last.
func lead(t *tensor.Tensor) int {
	m := 1
	for i := 0; i < t.Rank()-1; i++ {
		m *= t.Dim(i)
	}
	return m
}

// CheckGemm validates p (normalized) against the operands' sizes and dtypes:
// A, B and C of p.DType, Bias and Aux present, of the same dtype and of at least
// BiasLen and AuxLen elements exactly when the epilogue uses them.
func CheckGemm(p GemmParams, o GemmOperands) (GemmParams, error) {
	p = p.Normalized()
	if err := p.Validate(); err != nil {
		return p, err
	}
	if o.A == nil || o.B == nil || o.C == nil {
		return p, fmt.Errorf("%w: gemm needs A, B and C", ErrShape)
	}
	if err := sameDType(o.A, o.B); err != nil {
		return p, err
	}
	if err := sameDType(o.C, o.Bias, o.Aux); err != nil {
		return p, err
	}
	if o.A.DType() != p.DType || o.C.DType() != p.Out() {
		return p, fmt.Errorf("%w: gemm params %v -> %v, operands %v -> %v", ErrDType, p.DType, p.Out(), o.A.DType(), o.C.DType())
	}
	la, lb, lc := p.Lens()
	if o.A.Len() < la || o.B.Len() < lb || o.C.Len() < lc {
		return p, fmt.Errorf("%w: gemm needs A>=%d B>=%d C>=%d elements, have %d/%d/%d",
			ErrShape, la, lb, lc, o.A.Len(), o.B.Len(), o.C.Len())
	}
	for _, x := range []struct {
		name string
		t    *tensor.Tensor
		need int
		uses bool
	}{
		{"bias", o.Bias, p.BiasLen(), p.Epilogue.UsesBias()},
		{"aux", o.Aux, p.AuxLen(), p.Epilogue.UsesAux()},
	} {
		switch {
		case x.uses && x.t == nil:
			return p, fmt.Errorf("%w: gemm %v needs %s", ErrShape, p.Epilogue, x.name)
		case !x.uses && x.t != nil:
			return p, fmt.Errorf("%w: gemm %v takes no %s", ErrShape, p.Epilogue, x.name)
		case x.uses && x.t.Len() < x.need:
			return p, fmt.Errorf("%w: gemm %v needs %s of %d elements, have %d", ErrShape, p.Epilogue, x.name, x.need, x.t.Len())
		}
	}
	return p, nil
}

// CheckGemv validates p (normalized) against the operand sizes and dtypes.
func CheckGemv(p GemvParams, a, x, y *tensor.Tensor) (GemvParams, error) {
	p = p.Normalized()
	if err := p.Validate(); err != nil {
		return p, err
	}
	if err := sameDType(a, x, y); err != nil {
		return p, err
	}
	if y.DType() != p.DType {
		return p, fmt.Errorf("%w: gemv params %v, operands %v", ErrDType, p.DType, y.DType())
	}
	la, lx, ly := p.Lens()
	if a.Len() < la || x.Len() < lx || y.Len() < ly {
		return p, fmt.Errorf("%w: gemv needs A>=%d x>=%d y>=%d elements, have %d/%d/%d",
			ErrShape, la, lx, ly, a.Len(), x.Len(), y.Len())
	}
	return p, nil
}

func betaOf(accumulate bool) float64 {
	if accumulate {
		return 1
	}
	return 0
}

func sameDType(ts ...*tensor.Tensor) error {
	var dt tensor.DType
	for _, t := range ts {
		if t == nil {
			continue
		}
		if !t.DType().Valid() {
			return fmt.Errorf("%w: %v", ErrDType, t.DType())
		}
		if dt != 0 && t.DType() != dt {
			return fmt.Errorf("%w: mixed %v and %v", ErrDType, dt, t.DType())
		}
		dt = t.DType()
	}
	return nil
}

// SameDevice returns an error unless every non-nil tensor lives on kind.
func SameDevice(kind tensor.DeviceKind, ts ...*tensor.Tensor) error {
	for _, t := range ts {
		if t != nil && t.Device().Kind != kind {
			return fmt.Errorf("%w: %v on a %v provider", ErrDevice, t, kind)
		}
	}
	return nil
}

// CastDims checks Cast's operands: one shape, valid dtypes.
func CastDims(dst, src *tensor.Tensor) (int, error) {
	if !tensor.SameShape(dst, src) {
		return 0, fmt.Errorf("%w: cast %v to %v", ErrShape, src, dst)
	}
	if err := sameDType(dst); err != nil {
		return 0, err
	}
	return dst.Len(), sameDType(src)
}

// MSEDims checks MSE's operands: dy, y and target of one shape and dtype, sum a
// 1-element float64 tensor.
func MSEDims(dy, sum, y, target *tensor.Tensor) error {
	if _, err := ElementwiseDims(dy, y, target); err != nil {
		return err
	}
	if sum == nil || sum.Len() != 1 || sum.DType() != tensor.Float64 {
		return fmt.Errorf("%w: mse sum %v: want one float64", ErrShape, sum)
	}
	return nil
}
