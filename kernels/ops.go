package kernels

import (
	"fmt"
	"slices"

	"github.com/meshrun/meshrun/tensor"
)

// Op names one kernel.
type Op uint8

// The ops a provider may implement.
const (
	OpGemm Op = iota
	OpGemv
	OpLinearForward
	OpLinearBackwardInput
	OpLinearBackwardWeight
	OpLinearBackwardBias
	OpMatmulForward
	OpMatmulBackwardInput
	OpMatmulBackwardOther
	OpGeluForward
	OpGeluBackward
	numOps
)

var opNames = [numOps]string{
	"gemm", "gemv", "linear_forward", "linear_backward_input", "linear_backward_weight",
	"linear_backward_bias", "matmul_forward", "matmul_backward_input",
	"matmul_backward_other", "gelu_forward", "gelu_backward",
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

// Kernels is the set of ops. Every op is a pure computation on its operands: it
// writes only its output tensor, holds no autograd state, and decides nothing
// about which gradients are needed.
//
// Shapes (row-major; "..." is any number of leading dims, flattened into M):
//
//	LinearForward         y[...,N] = x[...,K] · w[N,K]ᵀ + b[N]  (b may be nil)
//	LinearBackwardInput   dx[...,K] = dy[...,N] · w[N,K]
//	LinearBackwardWeight  dw[N,K] (+)= dy[...,N]ᵀ · x[...,K]
//	LinearBackwardBias    db[N] (+)= Σ over rows of dy[...,N]
//	MatmulForward         c[B,M,N] = a[B,M,K] · b[B,K,N]   (rank 2 means B = 1)
//	MatmulBackwardInput   da[B,M,K] (+)= dc[B,M,N] · b[B,K,N]ᵀ
//	MatmulBackwardOther   db[B,K,N] (+)= a[B,M,K]ᵀ · dc[B,M,N]
//	GeluForward           y = gelu(x), tanh approximation (PyTorch approximate="tanh")
//	GeluBackward          dx = dy * gelu'(x)
//
// (+)= means the result is added to the output when accumulate is true and
// overwrites it (without reading it) otherwise.
type Kernels interface {
	Gemm(p GemmParams, a, b, c *tensor.Tensor) error
	Gemv(p GemvParams, a, x, y *tensor.Tensor) error
	LinearForward(y, x, w, b *tensor.Tensor) error
	LinearBackwardInput(dx, dy, w *tensor.Tensor) error
	LinearBackwardWeight(dw, dy, x *tensor.Tensor, accumulate bool) error
	LinearBackwardBias(db, dy *tensor.Tensor, accumulate bool) error
	MatmulForward(c, a, b *tensor.Tensor) error
	MatmulBackwardInput(da, dc, b *tensor.Tensor, accumulate bool) error
	MatmulBackwardOther(db, dc, a *tensor.Tensor, accumulate bool) error
	GeluForward(y, x *tensor.Tensor) error
	GeluBackward(dx, dy, x *tensor.Tensor) error
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
}

// LinearDims checks the operands of LinearForward (b may be nil) and returns the
// problem sizes: M rows of x, N outputs, K inputs.
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
	return m, n, k, sameDType(y, x, w, b)
}

// BiasDims checks LinearBackwardBias operands and returns (rows, N).
func BiasDims(db, dy *tensor.Tensor) (m, n int, err error) {
	if db.Rank() != 1 || dy.Rank() < 1 || dy.Dim(-1) != db.Dim(0) {
		return 0, 0, fmt.Errorf("%w: linear bias db=%v dy=%v", ErrShape, db, dy)
	}
	n = db.Dim(0)
	m = lead(dy)
	return m, n, sameDType(db, dy)
}

// LinearForwardGemm is the GEMM of LinearForward once y holds the broadcast bias
// (or zeros): y[M,N] = 1·x[M,K]·w[N,K]ᵀ + beta·y, beta = 1 with a bias, else 0.
func LinearForwardGemm(m, n, k int, bias bool, dt tensor.DType) GemmParams {
	beta := 0.0
	if bias {
		beta = 1
	}
	return GemmParams{TransB: true, M: m, N: n, K: k, Alpha: 1, Beta: beta, DType: dt}.Normalized()
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

// CheckGemm validates p (normalized) against the operand sizes and dtypes.
func CheckGemm(p GemmParams, a, b, c *tensor.Tensor) (GemmParams, error) {
	p = p.Normalized()
	if err := p.Validate(); err != nil {
		return p, err
	}
	if err := sameDType(a, b, c); err != nil {
		return p, err
	}
	if c.DType() != p.DType {
		return p, fmt.Errorf("%w: gemm params %v, operands %v", ErrDType, p.DType, c.DType())
	}
	la, lb, lc := p.Lens()
	if a.Len() < la || b.Len() < lb || c.Len() < lc {
		return p, fmt.Errorf("%w: gemm needs A>=%d B>=%d C>=%d elements, have %d/%d/%d",
			ErrShape, la, lb, lc, a.Len(), b.Len(), c.Len())
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
		if t.DType() != tensor.Float32 && t.DType() != tensor.Float64 {
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
