package spmd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/meshrun/meshrun/placement"
)

// stopped reports whether err ends the whole solve: the budget is spent or
// the context done (any other error only rules one strategy out).
func stopped(err error) bool {
	return errors.Is(err, placement.ErrBudget) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// exhaustive makes every strategy search price every strategy: tests
// compare the two.
var exhaustive = false

// strategyWork is the work of building and pricing one strategy besides its
// redistributions (planned by package placement, which counts their work).
const strategyWork = 64

// boundWork is the work of bounding one partial strategy.
const boundWork = 8

// solver finds the cheapest strategy of an einsum: per mesh dim, one of its
// candidate choices. It searches them depth first, one mesh dim at a time,
// and prices a strategy (plans its redistributions) only if a lower bound on
// every strategy that begins with the choices made so far can beat the
// strategies kept: the bound adds the arithmetic of the local op with the
// mesh dims still to choose splitting it fully, and placement.LowerBound of
// each move over the mesh dims chosen, with the others dividing the tensor.
// So it returns what pricing every strategy would (exhaustive does that, for
// tests), having priced few.
type solver struct {
	ctx        context.Context
	pl         *placement.Planner
	model      placement.Model
	e          einsum
	k          kind
	op         string
	inputs     []Operand
	given      []placement.Spec
	opts       Options
	cands      [][]choice
	sizes      []int
	cache      moveCache
	keep       int         // strategies kept: 1, or 1 + Options.Explain
	kept       []*strategy // the cheapest found, in order
	firstErr   error
	totalWork  float64 // multiply-adds of the whole einsum
	grads      int     // inputs (not the bias) whose gradients are wanted
	exhaustive bool
	// twin[i]: mesh dim i is interchangeable with mesh dim i-1 (see twins).
	twin []bool
	// Priced and Bounded count the strategies priced and the partial ones
	// bounded.
	priced, bounded int
}

// solve finds the cheapest strategy of an einsum and returns its plan,
// priced by pl's model and drawing its work from pl's budget. A plan pl's
// cache holds is not solved again.
func solve(ctx context.Context, pl *placement.Planner, op string, e einsum, k kind, inputs []Operand, opts Options) (*Plan, error) {
	if opts.stats == nil && !exhaustive {
		key := memoKey(op, e, k, inputs, opts, pl.Model())
		if p, ok := recallPlan(pl, key); ok {
			// A plan remembered costs no work, but a done context or a
			// spent budget still stops the caller.
			if err := pl.Spend(ctx, 0); err != nil {
				return nil, err
			}
			return p, nil
		}
		p, _, err := solveWith(ctx, pl, op, e, k, inputs, opts, false)
		if err == nil {
			rememberPlan(pl, key, p)
		}
		return p, err
	}
	p, sv, err := solveWith(ctx, pl, op, e, k, inputs, opts, exhaustive)
	if opts.stats != nil && sv != nil {
		n := 1
		for _, c := range sv.cands {
			n = int(placement.SatMul(int64(n), int64(len(c))))
		}
		*opts.stats = SearchStats{Strategies: n, Priced: sv.priced, Bounded: sv.bounded}
	}
	return p, err
}

func solveWith(ctx context.Context, pl *placement.Planner, op string, e einsum, k kind, inputs []Operand, opts Options, exhaustive bool) (*Plan, *solver, error) {
	mesh := inputs[0].Spec.Mesh
	given := make([]placement.Spec, len(inputs))
	for i, in := range inputs {
		given[i] = in.Spec
	}
	if opts.Out != nil && len(opts.Out) != mesh.NDim() {
		return nil, nil, fmt.Errorf("%w: %s: %d output placements for the %d-D mesh %s", ErrNoRule, describe(op, inputs), len(opts.Out), mesh.NDim(), mesh)
	}
	sv := &solver{ctx: ctx, pl: pl, model: pl.Model(), e: e, k: k, op: op, inputs: inputs, given: given,
		opts: opts, cands: make([][]choice, mesh.NDim()), sizes: mesh.Shape(), cache: newMoveCache(pl, mesh), keep: 1 + max(0, opts.Explain),
		exhaustive: exhaustive, totalWork: 1}
	for i := range sv.cands {
		sv.cands[i] = candidates(e, k, given, i)
		if mesh.Dim(i) == 1 {
			sv.cands[i] = oneRank(e, k, given, i, sv.cands[i])
		}
		sv.cands[i] = seqChoices(e, k, mesh, i, opts, sv.cands[i])
	}
	for _, l := range e.letters() {
		if k.counts(l) {
			sv.totalWork *= float64(e.size[l])
		}
	}
	sv.totalWork *= float64(k.factor())
	nIn := len(e.in)
	if k.bias {
		nIn--
	}
	for j := 0; j < nIn; j++ {
		if opts.needsGrad(inputs[j].Name) {
			sv.grads++
		}
	}
	sv.twin = twins(mesh, given, opts.Out)
	for i := 1; i < len(sv.twin); i++ {
		// A dim that may ring is not interchangeable with one that may not.
		sv.twin[i] = sv.twin[i] && opts.ringAllowed(mesh, i) == opts.ringAllowed(mesh, i-1)
	}
	if err := sv.search(make([]int, 0, mesh.NDim())); err != nil {
		return nil, sv, fmt.Errorf("%w (in %s)", err, describe(op, inputs))
	}
	if len(sv.kept) == 0 {
		return nil, sv, fmt.Errorf("%w: %s: no strategy reaches the output: %v", ErrNoRule, describe(op, inputs), sv.firstErr)
	}
	best := sv.kept[0]
	outName := opts.Output
	if outName == "" {
		outName = "y"
	}
	p := &Plan{Op: op, Equation: e.String(), Inputs: inputs, Moves: best.moves, Cost: best.cost, Model: best.model, Costs: best.costs,
		Output: Operand{Name: outName, Spec: best.out}, Final: Operand{Name: outName, Spec: best.final}}
	p.Ring = best.ring
	for i, c := range best.choices {
		p.Strategy = append(p.Strategy, mesh.DimName(i)+": "+c.label(e))
		if c.what == 'C' || c.what == 'G' {
			if p.seq == nil {
				p.seq = make([]byte, mesh.NDim())
			}
			p.seq[i] = c.what
		}
	}
	for i, in := range inputs {
		p.Local = append(p.Local, Operand{Name: in.Name, Spec: best.local[i]})
	}
	if opts.Explain > 0 {
		for i, s := range sv.kept {
			c := s.candidate(mesh, e)
			if i == 0 {
				p.Chosen = &c
			} else {
				p.RunnersUp = append(p.RunnersUp, c)
			}
		}
	}
	for i := range p.Moves {
		if p.Moves[i].Tensor == "" {
			p.Moves[i].Tensor = outName
		}
	}
	return p, sv, nil
}

// twins reports, per mesh dim, whether it is interchangeable with the one
// before it: the same size, every input replicated or partial alike on both,
// the same such output placement asked for. Swapping two neighbouring mesh
// dims then maps every layout of the problem to one of the same costs: each
// tensor dim's sharders keep their order relative to every other mesh dim,
// and no given layout has both dims sharding one tensor dim, where their own
// order would matter. So a strategy and the one with the two dims' choices
// swapped cost the same.
func twins(mesh placement.Mesh, given []placement.Spec, out []placement.Placement) []bool {
	same := func(a, b placement.Placement) bool {
		_, shard := a.(placement.Shard)
		return a == b && !shard
	}
	t := make([]bool, mesh.NDim())
	for i := 1; i < len(t); i++ {
		t[i] = mesh.Dim(i) == mesh.Dim(i-1) && (out == nil || same(out[i], out[i-1]))
		for _, g := range given {
			t[i] = t[i] && same(g.Placements[i], g.Placements[i-1])
		}
	}
	return t
}

// oneRank narrows the choices of a mesh dim of one rank, where every choice
// does the same work and moves nothing: to the first that keeps every input
// as given (no relabelling step), if one does.
func oneRank(e einsum, k kind, given []placement.Spec, i int, cands []choice) []choice {
	nIn := len(e.in)
	if k.bias {
		nIn--
	}
	for _, c := range cands {
		keeps := true
		for j := range e.in {
			if !keeps {
				break
			}
			if j < nIn {
				keeps = place(e, given, i, c, e.in[j], false, j) == given[j].Placements[i]
			} else {
				keeps = biasPlacement(e.out, e.in[j], place(e, given, i, c, e.out, true, -1)) == given[j].Placements[i]
			}
		}
		if keeps {
			return []choice{c}
		}
	}
	return cands
}

// threshold is the time a strategy must not exceed to be kept: the last
// kept one's once keep are kept.
func (sv *solver) threshold() placement.Picos {
	if sv.exhaustive || len(sv.kept) < sv.keep {
		return math.MaxInt64
	}
	return sv.kept[len(sv.kept)-1].costs.Time
}

// search extends the choices made for the first len(idx) mesh dims.
func (sv *solver) search(idx []int) error {
	i := len(idx)
	if i == len(sv.cands) {
		return sv.price(idx)
	}
	type option struct {
		c  int
		lb placement.Picos
	}
	first := 0
	if !sv.exhaustive && i > 0 && sv.twin[i] {
		// Mesh dims i-1 and i are interchangeable: the strategies with
		// their choices swapped cost the same, and the one in enumeration
		// order comes first; only those are searched.
		first = idx[i-1]
	}
	opts := make([]option, 0, len(sv.cands[i]))
	for c := first; c < len(sv.cands[i]); c++ {
		opts = append(opts, option{c, 0})
		if !sv.exhaustive {
			if err := sv.pl.Spend(sv.ctx, boundWork); err != nil {
				return err
			}
			sv.bounded++
			opts[len(opts)-1].lb = sv.bound(append(idx, c))
		}
	}
	// The most promising first: a cheap strategy found early prunes more.
	slices.SortStableFunc(opts, func(a, b option) int { return cmp.Compare(a.lb, b.lb) })
	for _, o := range opts {
		// A bound equal to the threshold may still tie and win on the
		// tie-breaks: only a larger one prunes.
		if o.lb > sv.threshold() {
			break
		}
		if err := sv.search(append(idx, o.c)); err != nil {
			return err
		}
	}
	return nil
}

// price prices the strategy idx and keeps it if it is among the cheapest.
func (sv *solver) price(idx []int) error {
	if err := sv.pl.Spend(sv.ctx, strategyWork); err != nil {
		return err
	}
	sv.priced++
	cs := make([]choice, len(idx))
	for i, c := range idx {
		cs[i] = sv.cands[i][c]
	}
	s, err := price(sv.ctx, sv.e, sv.k, sv.given, sv.inputs, cs, sv.opts, sv.cache, sv.threshold())
	if stopped(err) {
		return err
	}
	if errors.Is(err, errPruned) {
		return nil
	}
	if err != nil {
		if sv.firstErr == nil {
			sv.firstErr = err
		}
		return nil
	}
	s.index = slices.Clone(idx)
	at, _ := slices.BinarySearchFunc(sv.kept, s, func(a, b *strategy) int {
		if a.less(b) {
			return -1
		}
		return 1
	})
	if at < sv.keep || sv.exhaustive {
		sv.kept = slices.Insert(sv.kept, at, s)
		if !sv.exhaustive && len(sv.kept) > sv.keep {
			sv.kept = sv.kept[:sv.keep]
		}
	}
	return nil
}

// bound is a lower bound on the time of every strategy whose first mesh dims
// make the choices idx.
func (sv *solver) bound(idx []int) placement.Picos {
	n := len(idx)
	sizes := sv.sizes[:n]
	rest := 1.0 // the mesh dims not chosen yet
	for _, p := range sv.sizes[n:] {
		rest *= float64(p)
	}
	split := rest
	cs := make([]choice, n)
	for i, c := range idx {
		cs[i] = sv.cands[i][c]
		if cs[i].splits(cs[i].letter) && sv.k.counts(cs[i].letter) {
			split *= float64(sv.sizes[i])
		}
	}
	work := int64(sv.totalWork / split)
	lb := placement.SatPicos(sv.model.Compute(work), sv.model.Compute(placement.SatMul(work, int64(sv.grads))))
	e := sv.e
	nIn := len(e.in)
	if sv.k.bias {
		nIn--
	}
	outP := make([]placement.Placement, n)
	for i, c := range cs {
		outP[i] = place(e, sv.given, i, c, e.out, true, -1)
	}
	move := func(shape []int, from, to []placement.Placement) {
		elems, _ := placement.ShapeElems(shape)
		lb = placement.SatPicos(lb, placement.LowerBound(sv.model, float64(elems)/rest, len(shape), sizes, from, to))
	}
	for j := range e.in {
		local := make([]placement.Placement, n)
		for i, c := range cs {
			if j < nIn {
				local[i] = place(e, sv.given, i, c, e.in[j], false, j)
			} else {
				local[i] = biasPlacement(e.out, e.in[j], outP[i])
			}
		}
		g := sv.given[j]
		if len(sv.inputs[j].Also) == 0 {
			move(g.Shape, g.Placements[:n], local)
		}
		if !sv.opts.needsGrad(sv.inputs[j].Name) {
			continue
		}
		nat, target := naturalGrad(cs, local), dualPlacements(g.Placements[:n])
		if target != nil {
			move(g.Shape, nat, target)
		}
	}
	final := make([]placement.Placement, n)
	for i := range final {
		if sv.opts.Out != nil {
			final[i] = sv.opts.Out[i]
		} else if _, ok := outP[i].(placement.Partial); ok {
			final[i] = placement.Replicate{}
		} else {
			final[i] = outP[i]
		}
	}
	outShape := e.shapeOf(e.out)
	move(outShape, outP, final)
	if sv.grads > 0 {
		if from := dualPlacements(final); from != nil {
			move(outShape, from, dualPlacements(outP))
		}
	}
	return lb
}

// naturalGrad is where an input's gradient comes out under choices cs when
// the input was used as local: partial where the input was replicated but
// the strategy split the work on that mesh dim, replicated where the input
// was partial (every term's gradient is the whole gradient) or the work not
// split, sharded as the input was.
func naturalGrad(cs []choice, local []placement.Placement) []placement.Placement {
	nat := slices.Clone(local)
	for i, p := range nat {
		switch p.(type) {
		case placement.Replicate:
			if cs[i].what != 'R' {
				nat[i] = placement.Partial{Op: placement.Sum}
			}
		case placement.Partial:
			nat[i] = placement.Replicate{}
		}
	}
	return nat
}

// dualPlacements is the layout a gradient takes for a tensor laid out as ps
// (partial sums and averages replicated), nil where it has none (P(max),
// P(min)).
func dualPlacements(ps []placement.Placement) []placement.Placement {
	out := slices.Clone(ps)
	for i, p := range out {
		if q, ok := p.(placement.Partial); ok {
			if q.Op != placement.Sum && q.Op != placement.Avg {
				return nil
			}
			out[i] = placement.Replicate{}
		}
	}
	return out
}
