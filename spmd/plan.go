package spmd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/meshrun/meshrun/placement"
)

// Operand is a named tensor and its layout.
type Operand struct {
	Name string
	Spec placement.Spec
	// Also lists layouts of the same tensor the caller already holds (an output
	// gradient gathered for an earlier gradient): using one costs nothing.
	Also []placement.Spec
}

func (o Operand) String() string { return o.Name + "=" + o.Spec.String() }

// Move is the redistribution of one tensor, as placement.Plan returns it.
type Move struct {
	Tensor   string
	From, To placement.Spec
	Steps    []placement.Step
}

// Collective is one step that sends bytes between ranks.
type Collective struct {
	Tensor string
	Step   placement.Step
}

// Elems is the number of elements rank 0 passes into the collective.
func (c Collective) Elems() int64 { return c.Step.InputElems(0) }

// Plan is how one op runs on the mesh: the layouts the local op consumes and
// produces, and every redistribution around it.
type Plan struct {
	Op string
	// Equation is the einsum the local op computes, "..." expanded (upper-case
	// letters are batch dims).
	Equation string
	// Strategy says per mesh dim how the work is split.
	Strategy []string
	Inputs   []Operand // as given
	Local    []Operand // as the local op consumes them
	Output   Operand   // as the local op produces it
	Final    Operand   // as the consumer receives it
	// Moves holds the redistributions that do something: inputs in order, then
	// the output.
	Moves []Move
	// Cost is the number of elements all ranks send, in total.
	Cost int64
	// Model priced the plan; Costs are its modelled times.
	Model placement.Model
	Costs Costs
	// Chosen and RunnersUp are the chosen strategy and the next cheapest ones,
	// in order, with their modelled costs: filled when Options.Explain asks.
	Chosen    *Candidate
	RunnersUp []Candidate
}

// RowOffset is the first vocabulary row (an embedding's table) or column
// (pick's logits) the local op of rank holds: the lookups and their
// gradients read or add into only their shard's. 0 for every other op.
func (p *Plan) RowOffset(rank int) int {
	var s placement.Spec
	dim := 0
	switch p.Op {
	case "embedding":
		s = p.Local[1].Spec
	case "embedding.grad_table":
		s = p.Output.Spec
	case "pick": // the vocabulary is x's last dim
		s = p.Local[0].Spec
		dim = len(s.Shape) - 1
	case "pick.grad_x":
		s = p.Output.Spec
		dim = len(s.Shape) - 1
	default:
		return 0
	}
	_, off := s.Local(rank)
	return off[dim]
}

// Costs is what a strategy costs under the plan's Model. Strategies are
// ranked by Time, then fewer collectives, then less Memory.
type Costs struct {
	// Time = Comm + Forward + Backward.
	Time placement.Picos
	// Comm is the modelled time of the forward moves and of the way back of
	// the gradients of inputs that moved.
	Comm placement.Picos
	// Forward is the local op's arithmetic on the busiest rank; Backward that
	// of the gradients it will need (one op of the same size per input whose
	// gradient is wanted, the bias's a reduction left out).
	Forward, Backward placement.Picos
	// Work is the local op's multiply-adds on the busiest rank; BackwardWork
	// the gradients'.
	Work, BackwardWork int64
	// Memory is the elements the busiest rank holds of the local op's inputs
	// and output.
	Memory int64
}

// Candidate is one strategy the engine priced: per mesh dim how the work is
// split, and the modelled cost it was ranked by.
type Candidate struct {
	Strategy []string
	// Output is the placements the local op produces.
	Output []placement.Placement
	// Cost is the elements all ranks send (forward moves, and the way back of
	// the gradients of inputs that moved); Collectives and Steps count the
	// forward's; Work is the local op's multiply-adds on the busiest rank.
	Cost        int64
	Collectives int
	Steps       int
	Work        int64
	Costs       Costs
}

// Collectives lists, in order, every step of the plan that moves bytes.
func (p *Plan) Collectives() []Collective {
	var out []Collective
	for _, m := range p.Moves {
		for _, s := range m.Steps {
			if s.Moves() {
				out = append(out, Collective{Tensor: m.Tensor, Step: s})
			}
		}
	}
	return out
}

// CommElems is the number of elements rank 0 passes into the plan's collectives.
func (p *Plan) CommElems() int64 { return commElems(p.Collectives()) }

// commElems is the number of elements rank 0 passes into collectives cs.
func commElems(cs []Collective) int64 {
	var n int64
	for _, c := range cs {
		n += c.Elems()
	}
	return n
}

// Options steer a plan.
type Options struct {
	// Out is the placement the consumer wants for the output. Nil means the
	// placement the local op produces, with pending partial sums reduced (P -> R).
	Out []placement.Placement
	// Output names the output tensor (default "y").
	Output string
	// Grads names the inputs whose gradients will be computed (nil: all; empty:
	// none). A forward move of such an input is priced twice: its gradient comes
	// back the reverse way.
	Grads []string
	// Explain keeps this many runners-up to the chosen strategy in the plan
	// (Plan.RunnersUp), for a person to compare; 0 keeps none.
	Explain  int
	backward bool
	// stats, if set, receives the search's counts.
	stats *SearchStats
}

// SearchStats counts what one strategy search did.
type SearchStats struct {
	Strategies int // every combination of choices
	Priced     int // strategies priced (their moves planned)
	Bounded    int // partial strategies bounded
}

func (o Options) needsGrad(name string) bool {
	return !o.backward && (o.Grads == nil || slices.Contains(o.Grads, name))
}

type strategy struct {
	choices []choice
	local   []placement.Spec
	out     placement.Spec
	final   placement.Spec
	moves   []Move
	cost    int64 // elements sent by all ranks, forward moves plus reverse gradient moves
	moving  int   // steps that send bytes
	steps   int   // all steps
	work    int64 // multiply-adds of the local op on the busiest rank
	costs   Costs
	model   placement.Model
	plans   planCache
	index   []int // the choices' indices, for ties
}

// planCache remembers redistribution plans within one solve: strategies share
// most of their moves.
type planCache map[string]*cachedPlan

// cachedPlan is one redistribution plan with its prices, computed once:
// pricing a plan's bytes visits every rank of the mesh. A plan searched only
// up to a limit (because every strategy needing it was pruned) keeps the
// lower bound the search proved.
type cachedPlan struct {
	steps  []placement.Step
	err    error
	bytes  int64           // elements sent, all ranks together
	time   placement.Picos // modelled time
	moving int             // steps that send bytes
	above  placement.Picos // when the search stopped at a limit: its lower bound
}

// plan returns the plan from -> to, or errPruned if it takes more than
// limit.
func (c planCache) plan(ctx context.Context, from, to placement.Spec, limit placement.Picos) (*cachedPlan, error) {
	k := from.String() + ">" + to.String()
	p, ok := c[k]
	if ok && p.above == 0 {
		return p, p.err
	}
	if ok && p.above > limit {
		return nil, errPruned
	}
	steps, err := placement.PlanWithin(ctx, from, to, limit)
	if lb, ok := placement.AboveLimit(err); ok {
		c[k] = &cachedPlan{above: max(lb, 1)}
		return nil, errPruned
	}
	if stopped(err) {
		return nil, err
	}
	p = &cachedPlan{steps: steps, err: err}
	if err == nil {
		p.bytes = placement.PlanCost(steps)
		p.time = placement.ModelOf(ctx).PlanTime(steps)
		for _, st := range steps {
			if st.Moves() {
				p.moving++
			}
		}
	}
	c[k] = p
	return p, err
}

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

// less orders strategies: less modelled time, then fewer collectives, then
// less memory, then fewer steps. Equal strategies keep enumeration order.
func (s *strategy) less(o *strategy) bool {
	switch {
	case s.costs.Time != o.costs.Time:
		return s.costs.Time < o.costs.Time
	case s.moving != o.moving:
		return s.moving < o.moving
	case s.costs.Memory != o.costs.Memory:
		return s.costs.Memory < o.costs.Memory
	case s.steps != o.steps:
		return s.steps < o.steps
	}
	return slices.Compare(s.index, o.index) < 0
}

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
	budget     *placement.Budget
	model      placement.Model
	e          einsum
	k          kind
	op         string
	inputs     []Operand
	given      []placement.Spec
	opts       Options
	cands      [][]choice
	sizes      []int
	cache      planCache
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
// drawing its work from ctx's placement.Budget.
func solve(ctx context.Context, op string, e einsum, k kind, inputs []Operand, opts Options) (*Plan, error) {
	if opts.stats == nil && !exhaustive {
		key := memoKey(op, e, k, inputs, opts, placement.ModelOf(ctx))
		if p, ok := recallPlan(key); ok {
			// A plan remembered costs no work, but a done context or a
			// spent budget still stops the caller.
			b, ctx := placement.BudgetOf(ctx)
			if err := b.Spend(ctx, 0); err != nil {
				return nil, err
			}
			return p, nil
		}
		p, _, err := solveWith(ctx, op, e, k, inputs, opts, false)
		if err == nil {
			rememberPlan(key, p)
		}
		return p, err
	}
	p, sv, err := solveWith(ctx, op, e, k, inputs, opts, exhaustive)
	if opts.stats != nil && sv != nil {
		n := 1
		for _, c := range sv.cands {
			n = int(placement.SatMul(int64(n), int64(len(c))))
		}
		*opts.stats = SearchStats{Strategies: n, Priced: sv.priced, Bounded: sv.bounded}
	}
	return p, err
}

func solveWith(ctx context.Context, op string, e einsum, k kind, inputs []Operand, opts Options, exhaustive bool) (*Plan, *solver, error) {
	mesh := inputs[0].Spec.Mesh
	given := make([]placement.Spec, len(inputs))
	for i, in := range inputs {
		given[i] = in.Spec
	}
	if opts.Out != nil && len(opts.Out) != mesh.NDim() {
		return nil, nil, fmt.Errorf("%w: %s: %d output placements for the %d-D mesh %s", ErrNoRule, describe(op, inputs), len(opts.Out), mesh.NDim(), mesh)
	}
	budget, ctx := placement.BudgetOf(ctx)
	sv := &solver{ctx: ctx, budget: budget, model: placement.ModelOf(ctx), e: e, k: k, op: op, inputs: inputs, given: given,
		opts: opts, cands: make([][]choice, mesh.NDim()), sizes: mesh.Shape(), cache: planCache{}, keep: 1 + max(0, opts.Explain),
		exhaustive: exhaustive, totalWork: 1}
	for i := range sv.cands {
		sv.cands[i] = candidates(e, k, given, i)
		if mesh.Dim(i) == 1 {
			sv.cands[i] = oneRank(e, k, given, i, sv.cands[i])
		}
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
	if err := sv.search(make([]int, 0, mesh.NDim())); err != nil {
		return nil, sv, fmt.Errorf("%s: %w", describe(op, inputs), err)
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
	for i, c := range best.choices {
		p.Strategy = append(p.Strategy, mesh.DimName(i)+": "+c.label(e))
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
			if err := sv.budget.Spend(sv.ctx, boundWork); err != nil {
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
	if err := sv.budget.Spend(sv.ctx, strategyWork); err != nil {
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
		if cs[i].what == 'S' && sv.k.counts(cs[i].letter) {
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

func (s *strategy) candidate(mesh placement.Mesh, e einsum) Candidate {
	c := Candidate{Output: s.out.Placements, Cost: s.cost, Collectives: s.moving, Steps: s.steps, Work: s.work, Costs: s.costs}
	for i, ch := range s.choices {
		c.Strategy = append(c.Strategy, mesh.DimName(i)+": "+ch.label(e))
	}
	return c
}

// price builds one strategy's layouts and prices its redistributions.
func price(ctx context.Context, e einsum, k kind, given []placement.Spec, inputs []Operand, cs []choice, opts Options, cache planCache, limit placement.Picos) (*strategy, error) {
	mesh := given[0].Mesh
	nIn := len(e.in)
	if k.bias {
		nIn--
	}
	s := &strategy{choices: cs, plans: cache, model: placement.ModelOf(ctx)}
	outPl := make([]placement.Placement, len(cs))
	for i, c := range cs {
		outPl[i] = place(e, given, i, c, e.out, true, -1)
	}
	out, err := placement.NewSpec(e.shapeOf(e.out), mesh, outPl...)
	if err != nil {
		return nil, err
	}
	s.out = out
	var pending []pendingMove
	grads := 0
	for j := range e.in {
		pl := make([]placement.Placement, len(cs))
		for i, c := range cs {
			if j < nIn {
				pl[i] = place(e, given, i, c, e.in[j], false, j)
			} else {
				pl[i] = biasPlacement(e.out, e.in[j], outPl[i])
			}
		}
		local, err := placement.NewSpec(given[j].Shape, mesh, pl...)
		if err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(inputs[j].Also, local.Equal) {
			pending = append(pending, pendingMove{name: inputs[j].Name, from: given[j], to: local, forward: true})
		}
		if opts.needsGrad(inputs[j].Name) {
			// The gradient's way back under the same strategy, to the dual of
			// the given layout (none for P(max), P(min)).
			if target, _, err := dual("", Operand{Spec: given[j]}); err == nil {
				if from, err := placement.NewSpec(local.Shape, mesh, naturalGrad(cs, local.Placements)...); err == nil {
					pending = append(pending, pendingMove{from: from, to: target})
				}
			}
		}
		s.local = append(s.local, local)
		if j < nIn && opts.needsGrad(inputs[j].Name) {
			grads++
		}
	}
	s.work = work(e, k, cs, mesh)
	s.costs.Work, s.costs.BackwardWork = s.work, placement.SatMul(s.work, int64(grads))
	s.costs.Forward, s.costs.Backward = s.model.Compute(s.costs.Work), s.model.Compute(s.costs.BackwardWork)
	for _, l := range s.local {
		s.costs.Memory = placement.SatAdd(s.costs.Memory, l.MaxLocalElems())
	}
	s.costs.Memory = placement.SatAdd(s.costs.Memory, out.MaxLocalElems())
	final := out.Placements
	if opts.Out != nil {
		final = opts.Out
	} else {
		final = append([]placement.Placement(nil), final...)
		for i, p := range final {
			if _, ok := p.(placement.Partial); ok {
				final[i] = placement.Replicate{}
			}
		}
	}
	fs, err := placement.NewSpec(out.Shape, mesh, final...)
	if err != nil {
		return nil, err
	}
	s.final = fs
	pending = append(pending, pendingMove{from: out, to: fs, forward: true})
	if grads > 0 {
		// The output's gradient arrives as the dual of the final layout and
		// goes to what the local backward ops read: the output's layout, a
		// partial output's gradient replicated.
		if from, _, err := dual("", Operand{Spec: fs}); err == nil {
			need := slices.Clone(out.Placements)
			for i, p := range need {
				if _, ok := p.(placement.Partial); ok {
					need[i] = placement.Replicate{}
				}
			}
			if to, err := placement.NewSpec(out.Shape, mesh, need...); err == nil {
				pending = append(pending, pendingMove{from: from, to: to})
			}
		}
	}
	if err := s.planMoves(ctx, pending, limit); err != nil {
		return nil, err
	}
	s.costs.Time = placement.SatPicos(placement.SatPicos(s.costs.Comm, s.costs.Forward), s.costs.Backward)
	return s, nil
}

// pendingMove is one redistribution a strategy needs: forward (recorded in
// the plan, its tensor named; the output's unnamed) or of the backward (only
// priced).
type pendingMove struct {
	name     string
	from, to placement.Spec
	forward  bool
}

// errPruned ends the pricing of a strategy that cannot beat the limit.
var errPruned = errors.New("spmd: strategy priced above the limit")

// planMoves plans the moves in order, and gives up with errPruned as soon as
// the compute, the moves planned and lower bounds on the others exceed limit.
func (s *strategy) planMoves(ctx context.Context, moves []pendingMove, limit placement.Picos) error {
	lbs := make([]placement.Picos, len(moves))
	var rest placement.Picos
	if limit < math.MaxInt64 {
		for i, m := range moves {
			n, _ := placement.ShapeElems(m.from.Shape)
			lbs[i] = placement.LowerBound(s.model, float64(n), len(m.from.Shape), m.from.Mesh.Shape(), m.from.Placements, m.to.Placements)
			rest = placement.SatPicos(rest, lbs[i])
		}
	}
	base := placement.SatPicos(s.costs.Forward, s.costs.Backward)
	recorded := make([]*Move, len(moves))
	for i, m := range moves {
		spent := placement.SatPicos(placement.SatPicos(base, s.costs.Comm), rest)
		if limit < math.MaxInt64 && spent > limit {
			return errPruned
		}
		rest -= lbs[i]
		// What this move may take before the strategy passes the limit.
		within := placement.Picos(math.MaxInt64)
		if limit < math.MaxInt64 {
			within = limit - (spent - lbs[i])
		}
		if m.forward {
			mv, err := s.move(ctx, m.name, m.from, m.to, within)
			if err != nil {
				return err
			}
			recorded[i] = mv
			continue
		}
		if m.from.Equal(m.to) {
			continue
		}
		p, err := s.plans.plan(ctx, m.from, m.to, within)
		if errors.Is(err, errPruned) {
			return err
		}
		if err != nil {
			if stopped(err) {
				return err
			}
			continue // the backward search will say why
		}
		s.cost = placement.SatAdd(s.cost, p.bytes)
		s.costs.Comm = placement.SatPicos(s.costs.Comm, p.time)
	}
	for _, mv := range recorded {
		if mv != nil {
			s.moves = append(s.moves, *mv)
		}
	}
	return nil
}

// move plans a forward move and counts it; it returns the move, nil if it
// takes no step.
func (s *strategy) move(ctx context.Context, name string, from, to placement.Spec, limit placement.Picos) (*Move, error) {
	p, err := s.plans.plan(ctx, from, to, limit)
	if err != nil {
		return nil, err
	}
	s.cost = placement.SatAdd(s.cost, p.bytes)
	s.costs.Comm = placement.SatPicos(s.costs.Comm, p.time)
	s.steps += len(p.steps)
	s.moving += p.moving
	if len(p.steps) == 0 {
		return nil, nil
	}
	return &Move{Tensor: name, From: from, To: to, Steps: p.steps}, nil
}

// work is the number of multiply-adds of the local op on the busiest rank:
// the product of each letter's largest local size. A letter split by mesh
// dims of sizes q1, q2... is ceil(size / (q1·q2...)) at most; the letters
// depend on the coordinates of different mesh dims, so the largest product
// is the product of the largest sizes.
func work(e einsum, k kind, cs []choice, mesh placement.Mesh) int64 {
	w := k.factor()
	for _, l := range e.letters() {
		if !k.counts(l) {
			continue
		}
		q := int64(1)
		for i, c := range cs {
			if c.what == 'S' && c.letter == l {
				q *= int64(mesh.Dim(i))
			}
		}
		w = placement.SatMul(w, (int64(e.size[l])+q-1)/q)
	}
	return w
}

func describe(op string, inputs []Operand) string {
	parts := make([]string, len(inputs))
	for i, in := range inputs {
		parts[i] = in.String()
	}
	return op + " " + strings.Join(parts, " ")
}
