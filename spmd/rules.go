package spmd

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/meshrun/meshrun/placement"
)

// form says how the backward of a rule is derived from its forward einsum.
type form uint8

const (
	// product: a multilinear einsum; grad of input i = einsum(dy, other inputs -> input i).
	product form = iota
	// sum: a sum of broadcast inputs; grad of input i = dy summed down to input i.
	sum
	// unary: an elementwise nonlinear function f; grad = f'(x) * dy, elementwise.
	unary
	// fused: a nonlinear op of several inputs (layer norm, attention, an
	// embedding lookup); the gradient of input i is its own op,
	// "<op>.grad_<input>", of dy and the forward inputs reads[i], linear in
	// dy alone: it sums over the letters of dy its input lacks, so sharding
	// one leaves partial sums.
	fused
)

// rule is one op: its forward einsum and what it is linear in. The backward rule
// sits next to it, derived by gradOf from the same equation.
type rule struct {
	// equation returns the forward einsum for the input ranks (and reduced dims).
	equation func(ranks []int, dims []int) (string, error)
	inputs   []string // default input names
	kind     kind
	form     form
	// grad names the backward op of a unary rule.
	grad string
	// whole, if set, returns the letters of the expanded equation no strategy
	// shards (see kind.whole).
	whole func(e einsum, dims []int) string
	// reads[i]: the forward inputs the gradient of input i reads (fused).
	reads [][]int
	// nograd[i]: input i has no gradient, for the reason nogradWhy gives.
	nograd    []bool
	nogradWhy string
}

// kindOf is the rule's kind for an expanded equation.
func (r rule) kindOf(e einsum, dims []int) kind {
	k := r.kind
	if r.whole != nil {
		k.whole = r.whole(e, dims)
	}
	return k
}

// rules is every op the engine knows. It is never changed at run time.
var rules = map[string]rule{
	// y = x·Wᵀ + b with x[..., K], W[N, K] (PyTorch's layout), b[N].
	"linear": {
		equation: fixed("...k,nk,n->...n"),
		inputs:   []string{"x", "w", "b"},
		kind:     kind{linear: []bool{true, true, false}, bias: true},
		form:     product,
	},
	// The same without a bias.
	"linear_nobias": {
		equation: fixed("...k,nk->...n"),
		inputs:   []string{"x", "w"},
		kind:     kind{linear: []bool{true, true}},
		form:     product,
	},
	// Batched matmul with broadcast batch dims.
	"matmul": {
		equation: fixed("...mk,...kn->...mn"),
		inputs:   []string{"a", "b"},
		kind:     kind{linear: []bool{true, true}},
		form:     product,
	},
	// Elementwise add with broadcast (right-aligned, size-1 dims broadcast).
	"add": {
		equation: fixed("...,...->..."),
		inputs:   []string{"a", "b"},
		kind:     kind{linear: []bool{false, false}, additive: true},
		form:     sum,
	},
	"gelu": {equation: elementwise(1), inputs: []string{"x"}, kind: kind{linear: []bool{false}}, form: unary, grad: "gelu_backward"},
	"relu": {equation: elementwise(1), inputs: []string{"x"}, kind: kind{linear: []bool{false}}, form: unary, grad: "relu_backward"},
	// Sum over the given dims (all dims when none are given).
	"sum": {equation: reduction, inputs: []string{"x"}, kind: kind{linear: []bool{true}}, form: sum},
	// y = (x - mean) / sqrt(var + 1e-5) * gamma + beta over the last dim of x,
	// never sharded; the rows (every other dim) shard freely, as sequence
	// parallelism wants.
	"layernorm": {
		equation: fixed("...d,d,d->...d"),
		inputs:   []string{"x", "gamma", "beta"},
		kind:     kind{linear: []bool{false, false, false}},
		form:     fused,
		whole:    lettersOf("d"),
		reads:    [][]int{{0, 1}, {0}, {}},
	},
	// Softmax over one dim of x (dims: that dim; the last when none).
	"softmax": {
		equation: softmaxEquation,
		inputs:   []string{"x"},
		kind:     kind{linear: []bool{false}},
		form:     unary,
		grad:     "softmax_backward",
		whole:    lettersOf("z"),
	},
	// Causal scaled dot-product attention: o = softmax(q·kᵀ/√e, masked where
	// key position t > query position s)·v, per batch and head. q[..., s, h,
	// e], k[..., t, h, e], v[..., t, h, f] (the layout the projections give:
	// tokens, then heads), o[..., s, h, f]; batch dims and heads (h) shard,
	// the sequence and head dims stay whole, unless Options.Ring lets a mesh
	// dim keep the sequence split (ring attention, or the queries split:
	// ring.go).
	"attention": {
		equation: fixed("...she,...the,...thf->...shf"),
		inputs:   []string{"q", "k", "v"},
		// Work: q·kᵀ and p·v, s·t·e multiply-adds each when e = f.
		kind:  kind{linear: []bool{false, false, false}, free: "f", times: 2, seq: "st", causal: true},
		form:  fused,
		whole: lettersOf("stef"),
		reads: [][]int{{0, 1, 2}, {0, 1, 2}, {0, 1, 2}},
	},
	// Embedding lookup: y[..., :] = table[ids[...], :]. A table sharded by
	// rows (vocabulary-parallel) gives partial sums: each rank looks up the
	// ids in its rows and leaves zeros for the others. ids hold integers and
	// have no gradient; the table's is the rows of dy summed per id.
	"embedding": {
		equation:  fixed("...,vd->...d"),
		inputs:    []string{"ids", "table"},
		kind:      kind{linear: []bool{false, true}, free: "v"},
		form:      fused,
		reads:     [][]int{nil, {0}},
		nograd:    []bool{true, false},
		nogradWhy: "holds integer indices",
	},
	// The pieces of Megatron's vocabulary-parallel cross-entropy, loss =
	// log(sumexp(x, m)) + m − pick(x, target) with m = amax(x) over the
	// vocabulary (the last dim): each rule splits the vocabulary into
	// partials that one all-reduce combines (max, sum, sum).
	//
	// amax: the maximum over dims (all when none). A split reduced dim gives
	// partial maxima. Its gradient is refused: the cross-entropy uses it as
	// a constant (its terms cancel), and elsewhere it would route to the
	// arg-max, a property of the data.
	"amax": {equation: reduction, inputs: []string{"x"}, kind: kind{linear: []bool{false}, reduce: placement.Max},
		form: fused, reads: [][]int{nil}, nograd: []bool{true},
		nogradWhy: "is the maximum's input: its gradient belongs to the arg-max (data, undefined on ties); the cross-entropy takes the maximum as a constant"},
	// sumexp: Σ_v exp(x[..., v] − m[...]); a split v gives partial sums.
	"sumexp": {
		equation: fixed("...v,...->..."),
		inputs:   []string{"x", "m"},
		kind:     kind{linear: []bool{false, false}},
		form:     fused,
		reads:    [][]int{{0, 1}, {0, 1}},
	},
	// pick: x[..., target[...]], the target's logit; a split v gives partial
	// sums (each rank picks from its own columns, zeros elsewhere). target
	// holds integers and has no gradient.
	"pick": {
		equation:  fixed("...v,...->..."),
		inputs:    []string{"x", "target"},
		kind:      kind{linear: []bool{true, false}, free: "v"},
		form:      fused,
		reads:     [][]int{{1}, nil},
		nograd:    []bool{false, true},
		nogradWhy: "holds integer indices",
	},
}

func lettersOf(l string) func(einsum, []int) string {
	return func(einsum, []int) string { return l }
}

// softmaxEquation is elementwise over x, with the softmax dim's letter z
// (the local op finds its dim by it).
func softmaxEquation(ranks []int, dims []int) (string, error) {
	if len(dims) > 1 || len(dims) == 1 && (dims[0] < 0 || dims[0] >= ranks[0]) {
		return "", fmt.Errorf("%w: softmax over dims %v of a %d-D tensor (one dim)", ErrShape, dims, ranks[0])
	}
	if ranks[0] == 0 || ranks[0] > 25 {
		return "", fmt.Errorf("%w: softmax of a %d-D tensor", ErrShape, ranks[0])
	}
	d := ranks[0] - 1
	if len(dims) == 1 {
		d = dims[0]
	}
	t := []byte(letterRun(ranks[0]))
	t[d] = 'z'
	return string(t) + "->" + string(t), nil
}

// Ops lists the ops the engine knows, sorted.
func Ops() []string {
	var out []string
	for k := range rules {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func fixed(eq string) func([]int, []int) (string, error) {
	return func([]int, []int) (string, error) { return eq, nil }
}

func elementwise(n int) func([]int, []int) (string, error) {
	return func(ranks []int, _ []int) (string, error) {
		t := letterRun(ranks[0])
		terms := make([]string, n)
		for i := range terms {
			terms[i] = t
		}
		return strings.Join(terms, ",") + "->" + t, nil
	}
}

func reduction(ranks []int, dims []int) (string, error) {
	in := letterRun(ranks[0])
	var out []byte
	for d := 0; d < ranks[0]; d++ {
		if len(dims) > 0 && !slices.Contains(dims, d) {
			out = append(out, in[d])
		}
	}
	for _, d := range dims {
		if d < 0 || d >= ranks[0] {
			return "", fmt.Errorf("%w: sum over dim %d of a %d-D tensor", ErrShape, d, ranks[0])
		}
	}
	return in + "->" + string(out), nil
}

func letterRun(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + i)
	}
	return string(b)
}

// Request is an op to plan: its inputs in the op's order (names default to the
// op's own: x, w, b for linear) and, for sum, the dims reduced.
type Request struct {
	Op     string
	Inputs []Operand
	Dims   []int
	Options
}

// Forward plans an op with a placement.DefaultPlanner of its own
// (ForwardWith).
func Forward(req Request) (*Plan, error) { return ForwardWith(context.Background(), nil, req) }

// ForwardWith plans an op with pl (nil: a placement.DefaultPlanner), priced
// by its model: it stops with ctx's error once ctx is done, and with an error
// wrapping placement.ErrBudget once the work of pricing its strategies and
// planning their redistributions exceeds pl's budget. An op pl planned before
// is not planned again.
func ForwardWith(ctx context.Context, pl *placement.Planner, req Request) (*Plan, error) {
	if pl == nil {
		pl = placement.DefaultPlanner()
	}
	r, ok := rules[req.Op]
	if !ok {
		return nil, fmt.Errorf("%w: op %q (known: %s)", ErrNoRule, req.Op, strings.Join(Ops(), ", "))
	}
	if len(req.Inputs) != len(r.inputs) {
		return nil, fmt.Errorf("%w: %s takes %d inputs (%s), got %d", ErrNoRule, req.Op, len(r.inputs), strings.Join(r.inputs, ", "), len(req.Inputs))
	}
	inputs := slices.Clone(req.Inputs)
	for i := range inputs {
		if inputs[i].Name == "" {
			inputs[i].Name = r.inputs[i]
		}
		if err := inputs[i].Spec.Validate(); err != nil {
			return nil, fmt.Errorf("%w (in %s)", err, describe(req.Op, inputs))
		}
		if !inputs[i].Spec.Mesh.Equal(inputs[0].Spec.Mesh) {
			return nil, fmt.Errorf("%w: %s: %s is on mesh %s, %s on %s", ErrMesh, describe(req.Op, inputs),
				inputs[i].Name, inputs[i].Spec.Mesh, inputs[0].Name, inputs[0].Spec.Mesh)
		}
	}
	e, err := r.einsum(req.Op, inputs, req.Dims)
	if err != nil {
		return nil, err
	}
	opts := req.Options
	if r.nograd != nil {
		// Inputs without a gradient never need one.
		grads := []string{}
		for i, in := range inputs {
			if r.nograd[i] {
				if slices.Contains(opts.Grads, in.Name) {
					return nil, fmt.Errorf("%w: %s: %s %s and has no gradient", ErrGrad, describe(req.Op, inputs), in.Name, r.nogradWhy)
				}
			} else if opts.Grads == nil || slices.Contains(opts.Grads, in.Name) {
				grads = append(grads, in.Name)
			}
		}
		opts.Grads = grads
	}
	return solve(ctx, pl, req.Op, e, r.kindOf(e, req.Dims), inputs, opts)
}

func (r rule) einsum(op string, inputs []Operand, dims []int) (einsum, error) {
	ranks := make([]int, len(inputs))
	shapes := make([][]int, len(inputs))
	for i, in := range inputs {
		ranks[i], shapes[i] = len(in.Spec.Shape), in.Spec.Shape
	}
	eq, err := r.equation(ranks, dims)
	if err != nil {
		return einsum{}, fmt.Errorf("%w (in %s)", err, describe(op, inputs))
	}
	e, err := expand(eq, shapes)
	if err != nil {
		return einsum{}, fmt.Errorf("%w (in %s)", err, describe(op, inputs))
	}
	return e, nil
}

// Grad is the plan of one input's gradient.
type Grad struct {
	Input string // the forward input, "w"
	*Plan        // Output is "d" + Input, Final its layout as the caller gets it
	// Scale multiplies, on every rank, the gradient laid out as Final to give the
	// gradient of the rank's own local input: 1 unless the input or the output
	// is P(avg). An input P(avg) over n ranks contributes 1/n (see dual); an
	// output delivered as P(avg) over m ranks gets back dy already scaled by
	// 1/m (each rank's share), which the factor m undoes.
	Scale float64
}

// Backward is the plan of an op's backward pass.
type Backward struct {
	// DY is the output's gradient as it arrives: each rank's gradient of its own
	// local output (for a P(avg) output over m ranks, the global gradient scaled
	// by 1/m), laid out as the dual of the output's final layout.
	DY    Operand
	Grads []Grad // one per requested gradient, in input order
	// Ring is the forward's ring attention (Plan.Ring): the gradients run
	// on its ring, which passes the blocks Ring.Backward lists.
	Ring *Ring
}

// Collectives lists every step of the backward pass that moves bytes: a
// ring's transfers first.
func (b *Backward) Collectives() []Collective {
	var out []Collective
	if b.Ring != nil {
		out = b.Ring.collectives(b.Ring.Backward)
	}
	for _, g := range b.Grads {
		out = append(out, g.Collectives()...)
	}
	return out
}

// Costs sums the gradients' modelled costs (each gradient's own Costs.Forward
// is its compute, summed into Forward; Backward stays 0), and a ring's
// transfers beyond its compute (Ring.BackwardComm).
func (b *Backward) Costs() Costs {
	var c Costs
	if b.Ring != nil {
		c.Comm, c.Time = b.Ring.BackwardComm, b.Ring.BackwardComm
	}
	for _, g := range b.Grads {
		gc := g.Plan.Costs
		c.Time = placement.SatPicos(c.Time, gc.Time)
		c.Comm = placement.SatPicos(c.Comm, gc.Comm)
		c.Forward = placement.SatPicos(c.Forward, gc.Forward)
		c.Work = placement.SatAdd(c.Work, gc.Work)
		c.Memory = max(c.Memory, gc.Memory)
	}
	return c
}

// CommElems is the number of elements rank 0 passes into the backward collectives.
func (b *Backward) CommElems() int64 { return commElems(b.Collectives()) }

// dual is the layout of a tensor's gradient given the tensor's layout, and the
// factor that turns the global gradient into what each rank holds for its own
// local copy (∂L/∂ of its local tensor):
//
//   - a shard's gradient is the shard (factor 1);
//   - a replica's gradient arrives as partial sums and is reduced to a replica
//     (factor 1: the tensor is one value, its gradient the whole gradient);
//   - P(sum), t = Σ_r t_r: ∂t/∂t_r = 1, so each term's gradient is the whole
//     gradient, replicated (factor 1);
//   - P(avg), t = (1/n) Σ_r t_r over the n ranks of the mesh dim: ∂t/∂t_r = 1/n,
//     so the gradient is replicated and each rank scales it by 1/n (factors of
//     several avg mesh dims multiply);
//   - P(max) and P(min) are refused (ErrGrad): t = max_r t_r routes the gradient
//     of each element to the rank holding the largest value, which depends on
//     the data rather than on the layout, is undefined where ranks tie (R -> P(max)
//     makes every rank tie on every element), and would need the forward values
//     of every rank kept and compared: no placement describes it.
func dual(op string, o Operand) (placement.Spec, float64, error) {
	ps := slices.Clone(o.Spec.Placements)
	scale := 1.0
	for i, p := range ps {
		q, ok := p.(placement.Partial)
		if !ok {
			continue
		}
		switch q.Op {
		case placement.Sum:
		case placement.Avg:
			scale /= float64(o.Spec.Mesh.Dim(i))
		default:
			return placement.Spec{}, 0, fmt.Errorf("%w: %s: the gradient of %s, partial %s on mesh dim %s, has no layout: "+
				"it belongs to whichever rank holds the %s of each element (a property of the data, undefined on ties); "+
				"reduce %s (all_reduce %s) where a gradient must flow through it",
				ErrGrad, op, o, q.Op, o.Spec.Mesh.DimName(i), q.Op, o.Name, q.Op)
		}
		ps[i] = placement.Replicate{}
	}
	return o.Spec.WithPlacements(ps...), scale, nil
}

// BackwardOf plans the gradients of fwd's inputs named in grads (nil: all). A
// gradient not requested is not planned and costs nothing. The output gradient
// arrives laid out as the dual of the forward's final output; each input's
// gradient is delivered in the dual of that input's given layout. The local
// backward ops read the forward's inputs as the forward's local op consumed
// them (what the forward saves).
// It plans with a placement.DefaultPlanner of its own (BackwardOfWith).
func BackwardOf(fwd *Plan, grads []string, dims []int) (*Backward, error) {
	return BackwardOfWith(context.Background(), nil, fwd, grads, dims)
}

// BackwardOfWith is BackwardOf with pl, as ForwardWith is Forward: the
// gradients share pl's budget and cache.
func BackwardOfWith(ctx context.Context, pl *placement.Planner, fwd *Plan, grads []string, dims []int) (*Backward, error) {
	if pl == nil {
		pl = placement.DefaultPlanner()
	}
	r := rules[fwd.Op]
	if grads == nil {
		for i, in := range fwd.Inputs {
			if r.nograd == nil || !r.nograd[i] {
				grads = append(grads, in.Name)
			}
		}
	}
	for _, g := range grads {
		i := slices.IndexFunc(fwd.Inputs, func(o Operand) bool { return o.Name == g })
		if i < 0 {
			return nil, fmt.Errorf("%w: %s has no input %q", ErrGrad, fwd.Op, g)
		}
		if r.nograd != nil && r.nograd[i] {
			return nil, fmt.Errorf("%w: %s: %s %s and has no gradient", ErrGrad, fwd.Op, g, r.nogradWhy)
		}
	}
	dySpec, dyScale, err := dual(fwd.Op, fwd.Final)
	if err != nil {
		return nil, err
	}
	dy := Operand{Name: "d" + fwd.Final.Name, Spec: dySpec}
	e, err := r.einsum(fwd.Op, fwd.Inputs, dims)
	if err != nil {
		return nil, err
	}
	b := &Backward{DY: dy, Ring: fwd.Ring}
	for i, in := range fwd.Inputs {
		if !slices.Contains(grads, in.Name) {
			continue
		}
		target, scale, err := dual(fwd.Op, in)
		if err != nil {
			return nil, err
		}
		op, ge, gk, operands := gradOf(fwd.Op, r, e, i)
		fk := r.kindOf(e, dims)
		gk.whole, gk.free, gk.times, gk.seq, gk.causal = fk.whole, fk.free, fk.times, fk.seq, fk.causal
		ins := make([]Operand, len(operands))
		for j, o := range operands {
			if o < 0 {
				ins[j] = dy
			} else {
				ins[j] = fwd.Local[o]
			}
		}
		p, err := solve(ctx, pl, op, ge, gk, ins, Options{Out: target.Placements, Output: "d" + in.Name, backward: true, force: fwd.seq})
		if err != nil {
			return nil, err
		}
		// A layout of dy one gradient gathered serves the next ones for free.
		for _, m := range p.Moves {
			if m.Tensor == dy.Name {
				dy.Also = append(dy.Also, m.To)
			}
		}
		b.Grads = append(b.Grads, Grad{Input: in.Name, Plan: p, Scale: scale / dyScale})
	}
	return b, nil
}

// gradOf derives the gradient einsum of input i from the forward einsum: its
// name, equation, linearity and operands (-1 is dy, j is forward input j).
func gradOf(op string, r rule, e einsum, i int) (string, einsum, kind, []int) {
	name := op + ".grad_" + r.inputs[i]
	ge := einsum{size: e.size, out: e.in[i]}
	switch {
	case r.form == unary:
		ge.in = []string{e.out, e.in[0]}
		return r.grad, ge, kind{linear: []bool{true, false}}, []int{-1, 0}
	case r.form == fused:
		ge.in = []string{e.out}
		operands := []int{-1}
		lin := []bool{true}
		for _, j := range r.reads[i] {
			ge.in = append(ge.in, e.in[j])
			operands = append(operands, j)
			lin = append(lin, false)
		}
		return name, ge, kind{linear: lin}, operands
	case r.form == sum || (r.kind.bias && i == len(e.in)-1):
		ge.in = []string{e.out}
		return name, ge, kind{linear: []bool{true}}, []int{-1}
	}
	ge.in = []string{e.out}
	operands := []int{-1}
	n := len(e.in)
	if r.kind.bias {
		n--
	}
	for j := 0; j < n; j++ {
		if j != i {
			ge.in = append(ge.in, e.in[j])
			operands = append(operands, j)
		}
	}
	lin := make([]bool, len(ge.in))
	for j := range lin {
		lin[j] = true
	}
	return name, ge, kind{linear: lin}, operands
}

// InputNames lists an op's inputs in order ("x", "w", "b" for linear).
func InputNames(op string) ([]string, error) {
	r, ok := rules[op]
	if !ok {
		return nil, fmt.Errorf("%w: op %q (known: %s)", ErrNoRule, op, strings.Join(Ops(), ", "))
	}
	return slices.Clone(r.inputs), nil
}
