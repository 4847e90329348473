package kernels

import (
	"fmt"

	"github.com/meshrun/meshrun/tensor"
)

// Grouped GEMMs: E linear layers (experts) applied to E contiguous runs of
// rows of one packed buffer, as a mixture-of-experts layer runs them. Expert e
// owns rows [r_e, r_e + Rows[e]) of the packed operands (r_e = Σ Rows[:e]),
// and its weight W_e[N, K] is the e-th matrix of W[E, N, K] (PyTorch's Linear
// layout: y = x·Wᵀ + b). Shapes, R = Σ Rows:
//
//	GroupedForward         A = x[R, K], B = W[E, N, K], C = y[R, N]
//	                       y_e = x_e·W_eᵀ (Bias[E, N]: + b_e; BiasGelu keeps
//	                       the pre-activation in Aux[R, N])
//	GroupedBackwardInput   A = dy[R, N], B = W[E, N, K], C = dx[R, K]
//	                       dx_e = dy_e·W_e (DGelu: ⊙ gelu'(Aux[R, K]);
//	                       DGeluBGrad: and Bias[E, K] = Σ rows of dx_e)
//	GroupedBackwardWeight  A = dy[R, N], B = x[R, K], C = dW[E, N, K]
//	                       dW_e (+)= dy_eᵀ·x_e (BGrad: and Bias[E, N] =
//	                       Σ rows of dy_e, overwritten)
//
// Each expert is the dense linear op's GEMM (LinearForwardGemm, ...), so E = 1
// is the dense op. An expert with no rows is the GEMM with M = 0 (forward and
// input: nothing to write) or K = 0 (weight: dW_e = 0 and its bias gradient
// 0, written; dW_e kept exactly when accumulating), as EmptyGemm defines them:
// never skipped, never handed to a library.

// GroupedKind says which of the linear layer's GEMMs a grouped GEMM runs.
type GroupedKind uint8

// The grouped GEMMs.
const (
	GroupedForward GroupedKind = iota
	GroupedBackwardInput
	GroupedBackwardWeight
	numGroupedKinds
)

var groupedNames = [numGroupedKinds]string{"forward", "backward_input", "backward_weight"}

func (g GroupedKind) String() string {
	if g < numGroupedKinds {
		return groupedNames[g]
	}
	return fmt.Sprintf("grouped(%d)", uint8(g))
}

// groupedEpilogues lists the epilogues each kind takes.
var groupedEpilogues = [numGroupedKinds][]Epilogue{
	{EpilogueNone, EpilogueBias, EpilogueBiasGelu},
	{EpilogueNone, EpilogueDGelu, EpilogueDGeluBGrad},
	{EpilogueNone, EpilogueBGrad},
}

// GroupedParams describes a grouped GEMM (see GroupedKind): E = len(Rows)
// experts of weights [N, K], expert e taking Rows[e] >= 0 rows.
type GroupedParams struct {
	Kind GroupedKind
	Rows []int
	N, K int
	// Accumulate adds the weight gradient to dW (GroupedBackwardWeight only).
	Accumulate bool
	// DType and OutDType are as GemmParams'.
	DType, OutDType tensor.DType
	// Epilogue is the dense GEMM's epilogue, per expert.
	Epilogue Epilogue
}

// E is the number of experts.
func (p GroupedParams) E() int { return len(p.Rows) }

// TotalRows is R = Σ Rows.
func (p GroupedParams) TotalRows() int {
	r := 0
	for _, m := range p.Rows {
		r += m
	}
	return r
}

// Out is the element type of C, Bias and Aux.
func (p GroupedParams) Out() tensor.DType {
	if p.OutDType != 0 {
		return p.OutDType
	}
	return p.DType
}

// Flops returns the floating-point operations (2·R·N·K).
func (p GroupedParams) Flops() float64 {
	return 2 * float64(p.TotalRows()) * float64(p.N) * float64(p.K)
}

// Validate reports every problem of the description at once.
func (p GroupedParams) Validate() error {
	var errs []string
	if p.Kind >= numGroupedKinds {
		errs = append(errs, p.Kind.String())
	}
	if len(p.Rows) == 0 || p.N < 0 || p.K < 0 {
		errs = append(errs, fmt.Sprintf("E=%d N=%d K=%d", len(p.Rows), p.N, p.K))
	}
	for e, m := range p.Rows {
		if m < 0 {
			errs = append(errs, fmt.Sprintf("expert %d has %d rows", e, m))
		}
	}
	if p.Kind < numGroupedKinds && !contains(groupedEpilogues[p.Kind], p.Epilogue) {
		errs = append(errs, fmt.Sprintf("%v takes no %v", p.Kind, p.Epilogue))
	}
	if p.Accumulate && p.Kind != GroupedBackwardWeight {
		errs = append(errs, fmt.Sprintf("%v does not accumulate", p.Kind))
	}
	badType := !GemmDTypes(p.DType, p.Out())
	if badType {
		errs = append(errs, fmt.Sprintf("dtype %v -> %v", p.DType, p.Out()))
	}
	switch {
	case len(errs) == 0:
		return nil
	case badType:
		return fmt.Errorf("%w (%w): grouped gemm %v", ErrShape, ErrDType, errs)
	}
	return fmt.Errorf("%w: grouped gemm %v", ErrShape, errs)
}

func contains(es []Epilogue, e Epilogue) bool {
	for _, x := range es {
		if x == e {
			return true
		}
	}
	return false
}

// GroupedExpert is one expert's GEMM of a grouped GEMM and where its operands
// start (in elements) in the grouped operands.
type GroupedExpert struct {
	Gemm                   GemmParams
	OffA, OffB, OffC       int
	OffBias, OffAux        int
	ShapeA, ShapeB, ShapeC [2]int
	ShapeBias, ShapeAux    int // elements; 0: none
}

// Experts returns each expert's GEMM (normalized, tight) and operand windows.
func (p GroupedParams) Experts() []GroupedExpert {
	out := make([]GroupedExpert, len(p.Rows))
	r, n, k := 0, p.N, p.K
	for e, m := range p.Rows {
		x := &out[e]
		switch p.Kind {
		case GroupedForward:
			x.Gemm = LinearForwardGemm(m, n, k, false, p.DType)
			x.OffA, x.OffB, x.OffC, x.OffBias, x.OffAux = r*k, e*n*k, r*n, e*n, r*n
			x.ShapeA, x.ShapeB, x.ShapeC = [2]int{m, k}, [2]int{n, k}, [2]int{m, n}
		case GroupedBackwardInput:
			x.Gemm = LinearBackwardInputGemm(m, n, k, p.DType)
			x.OffA, x.OffB, x.OffC, x.OffBias, x.OffAux = r*n, e*n*k, r*k, e*k, r*k
			x.ShapeA, x.ShapeB, x.ShapeC = [2]int{m, n}, [2]int{n, k}, [2]int{m, k}
		default:
			x.Gemm = LinearBackwardWeightGemm(m, n, k, p.Accumulate, p.DType)
			x.OffA, x.OffB, x.OffC, x.OffBias = r*n, r*k, e*n*k, e*n
			x.ShapeA, x.ShapeB, x.ShapeC = [2]int{m, n}, [2]int{m, k}, [2]int{n, k}
		}
		x.Gemm.Epilogue = p.Epilogue
		if p.Out() != p.DType {
			x.Gemm.OutDType = p.Out()
		}
		x.ShapeBias, x.ShapeAux = x.Gemm.BiasLen(), x.Gemm.AuxLen()
		r += m
	}
	return out
}

// groupedShapes returns the shapes A, B, C, Bias and Aux must have (nil: absent).
func (p GroupedParams) groupedShapes() [5][]int {
	e, r, n, k := len(p.Rows), p.TotalRows(), p.N, p.K
	var s [5][]int
	switch p.Kind {
	case GroupedForward:
		s = [5][]int{{r, k}, {e, n, k}, {r, n}, {e, n}, {r, n}}
	case GroupedBackwardInput:
		s = [5][]int{{r, n}, {e, n, k}, {r, k}, {e, k}, {r, k}}
	default:
		s = [5][]int{{r, n}, {r, k}, {e, n, k}, {e, n}, nil}
	}
	if !p.Epilogue.UsesBias() {
		s[3] = nil
	}
	if !p.Epilogue.UsesAux() {
		s[4] = nil
	}
	return s
}

// CheckGrouped validates p against its operands: their shapes exactly as the
// kind says (Bias and Aux present exactly when the epilogue uses them), A and
// B of p.DType, C, Bias and Aux of p.Out().
func CheckGrouped(p GroupedParams, o GemmOperands) error {
	if err := p.Validate(); err != nil {
		return err
	}
	names := [5]string{"A", "B", "C", "bias", "aux"}
	ts := [5]*tensor.Tensor{o.A, o.B, o.C, o.Bias, o.Aux}
	for i, want := range p.groupedShapes() {
		t := ts[i]
		switch {
		case want == nil && t != nil:
			return fmt.Errorf("%w: grouped gemm %v %v takes no %s", ErrShape, p.Kind, p.Epilogue, names[i])
		case want == nil:
			continue
		case t == nil:
			return fmt.Errorf("%w: grouped gemm %v %v needs %s", ErrShape, p.Kind, p.Epilogue, names[i])
		case !shapeIs(t, want):
			return fmt.Errorf("%w: grouped gemm %v: %s is %v, want shape %v", ErrShape, p.Kind, names[i], t, want)
		}
		dt := p.DType
		if i >= 2 {
			dt = p.Out()
		}
		if t.DType() != dt {
			return fmt.Errorf("%w: grouped gemm %v: %s is %v, want %v", ErrDType, p.Kind, names[i], t.DType(), dt)
		}
	}
	return nil
}

func shapeIs(t *tensor.Tensor, shape []int) bool {
	if t.Rank() != len(shape) {
		return false
	}
	for i, d := range shape {
		if t.Dim(i) != d {
			return false
		}
	}
	return true
}

// Window returns a tensor of shape over t's elements [off, off+Π shape): the
// provider's own view of its memory (a host slice, a device address).
type Window func(t *tensor.Tensor, off int, shape ...int) (*tensor.Tensor, error)

// GroupedLoop runs a checked grouped GEMM as one Gemm per expert on k, in
// expert order, over windows of the operands (what providers without a faster
// grouped path run). Empty experts go through k.Gemm too (EmptyGemm's rules).
func GroupedLoop(k Kernels, p GroupedParams, o GemmOperands, win Window) error {
	for _, x := range p.Experts() {
		eo, err := x.Operands(o, win)
		if err != nil {
			return err
		}
		if err := k.Gemm(x.Gemm, eo); err != nil {
			return err
		}
	}
	return nil
}

// Operands returns the expert's windows of the grouped operands o.
func (x GroupedExpert) Operands(o GemmOperands, win Window) (GemmOperands, error) {
	var eo GemmOperands
	var err error
	for _, w := range []struct {
		dst   **tensor.Tensor
		src   *tensor.Tensor
		off   int
		shape []int
	}{
		{&eo.A, o.A, x.OffA, x.ShapeA[:]},
		{&eo.B, o.B, x.OffB, x.ShapeB[:]},
		{&eo.C, o.C, x.OffC, x.ShapeC[:]},
		{&eo.Bias, o.Bias, x.OffBias, []int{x.ShapeBias}},
		{&eo.Aux, o.Aux, x.OffAux, []int{x.ShapeAux}},
	} {
		if w.src == nil {
			continue
		}
		if *w.dst, err = win(w.src, w.off, w.shape...); err != nil {
			return GemmOperands{}, err
		}
	}
	return eo, nil
}

// HostWindow is Window for host tensors: a slice of t's data.
func HostWindow(t *tensor.Tensor, off int, shape ...int) (*tensor.Tensor, error) {
	n := tensor.NumElements(shape)
	if off < 0 || off+n > t.Len() {
		return nil, fmt.Errorf("%w: window [%d, %d) of %v", ErrShape, off, off+n, t)
	}
	switch t.DType() {
	case tensor.Float32:
		return tensor.FromFloat32(t.Float32()[off:off+n:off+n], shape...)
	case tensor.Float64:
		return tensor.FromFloat64(t.Float64()[off:off+n:off+n], shape...)
	case tensor.BFloat16:
		return tensor.FromBFloat16(t.BFloat16()[off:off+n:off+n], shape...)
	}
	return nil, fmt.Errorf("%w: window of %v", ErrDType, t.DType())
}
