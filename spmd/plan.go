package spmd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
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
	// Chosen and RunnersUp are the chosen strategy and the next cheapest ones,
	// in order, with their modelled costs: filled when Options.Explain asks.
	Chosen    *Candidate
	RunnersUp []Candidate
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
func (p *Plan) CommElems() int64 {
	var n int64
	for _, c := range p.Collectives() {
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
	plans   planCache
}

// planCache remembers redistribution plans within one solve: strategies share
// most of their moves.
type planCache map[string]cachedPlan

type cachedPlan struct {
	steps []placement.Step
	err   error
}

func (c planCache) plan(ctx context.Context, from, to placement.Spec) ([]placement.Step, error) {
	k := from.String() + ">" + to.String()
	if p, ok := c[k]; ok {
		return p.steps, p.err
	}
	steps, err := placement.PlanContext(ctx, from, to)
	if stopped(err) {
		return nil, err
	}
	c[k] = cachedPlan{steps, err}
	return steps, err
}

// stopped reports whether err ends the whole solve: the budget is spent or
// the context done (any other error only rules one strategy out).
func stopped(err error) bool {
	return errors.Is(err, placement.ErrBudget) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// strategyWork is the work of building and pricing one strategy besides its
// redistributions (planned by package placement, which counts their work) and
// the local work it measures on every rank.
const strategyWork = 64

// less orders strategies: fewer elements sent, then fewer collectives, then fewer
// steps, then less local work. Equal strategies keep enumeration order.
func (s *strategy) less(o *strategy) bool {
	switch {
	case s.cost != o.cost:
		return s.cost < o.cost
	case s.moving != o.moving:
		return s.moving < o.moving
	case s.steps != o.steps:
		return s.steps < o.steps
	}
	return s.work < o.work
}

// solve enumerates every strategy of an einsum and returns the cheapest plan,
// drawing its work from ctx's placement.Budget.
func solve(ctx context.Context, op string, e einsum, k kind, inputs []Operand, opts Options) (*Plan, error) {
	mesh := inputs[0].Spec.Mesh
	given := make([]placement.Spec, len(inputs))
	for i, in := range inputs {
		given[i] = in.Spec
	}
	if opts.Out != nil && len(opts.Out) != mesh.NDim() {
		return nil, fmt.Errorf("%w: %s: %d output placements for the %d-D mesh %s", ErrNoRule, describe(op, inputs), len(opts.Out), mesh.NDim(), mesh)
	}
	cands := make([][]choice, mesh.NDim())
	n, ok := int64(1), true
	for i := range cands {
		cands[i] = candidates(e, k, given, i)
		if ok {
			n, ok = placement.MulSize(n, int64(len(cands[i])))
		}
	}
	// Every strategy is priced: refuse at once what the budget cannot cover.
	budget, _ := placement.BudgetOf(ctx)
	per := strategyWork + int64(mesh.Size())*int64(len(e.in)+1)
	if total, fits := placement.MulSize(n, per); !ok || !fits || total > budget.Left() {
		return nil, fmt.Errorf("%s: %s strategies on mesh %s: planning needs more than the work its budget has left (%d units; a mesh of fewer dims or ranks plans within it): %w",
			describe(op, inputs), strategyCount(cands), mesh, budget.Left(), placement.ErrBudget)
	}
	var best *strategy
	var all []*strategy // with Explain: every strategy that reaches the output
	var firstErr error
	cache := planCache{}
	idx := make([]int, mesh.NDim())
	for {
		cs := make([]choice, mesh.NDim())
		for i := range cs {
			cs[i] = cands[i][idx[i]]
		}
		if err := budget.Spend(ctx, per); err != nil {
			return nil, fmt.Errorf("%s: %w", describe(op, inputs), err)
		}
		s, err := price(ctx, e, k, given, inputs, cs, opts, cache)
		if stopped(err) {
			return nil, fmt.Errorf("%s: %w", describe(op, inputs), err)
		}
		if err == nil && opts.Explain > 0 {
			all = append(all, s)
		}
		if err == nil && (best == nil || s.less(best)) {
			best = s
		} else if err != nil && firstErr == nil {
			firstErr = err
		}
		// Next combination, last mesh dim fastest.
		i := len(idx) - 1
		for ; i >= 0; i-- {
			idx[i]++
			if idx[i] < len(cands[i]) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			break
		}
	}
	if best == nil {
		return nil, fmt.Errorf("%w: %s: no strategy reaches the output: %v", ErrNoRule, describe(op, inputs), firstErr)
	}
	outName := opts.Output
	if outName == "" {
		outName = "y"
	}
	p := &Plan{Op: op, Equation: e.String(), Inputs: inputs, Moves: best.moves, Cost: best.cost,
		Output: Operand{Name: outName, Spec: best.out}, Final: Operand{Name: outName, Spec: best.final}}
	for i, c := range best.choices {
		p.Strategy = append(p.Strategy, mesh.DimName(i)+": "+c.label(e))
	}
	for i, in := range inputs {
		p.Local = append(p.Local, Operand{Name: in.Name, Spec: best.local[i]})
	}
	if opts.Explain > 0 {
		// A stable sort keeps enumeration order among equals: best comes first.
		slices.SortStableFunc(all, func(a, b *strategy) int {
			switch {
			case a.less(b):
				return -1
			case b.less(a):
				return 1
			}
			return 0
		})
		for i, s := range all[:min(len(all), opts.Explain+1)] {
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
	return p, nil
}

func (s *strategy) candidate(mesh placement.Mesh, e einsum) Candidate {
	c := Candidate{Output: s.out.Placements, Cost: s.cost, Collectives: s.moving, Steps: s.steps, Work: s.work}
	for i, ch := range s.choices {
		c.Strategy = append(c.Strategy, mesh.DimName(i)+": "+ch.label(e))
	}
	return c
}

// price builds one strategy's layouts and prices its redistributions.
func price(ctx context.Context, e einsum, k kind, given []placement.Spec, inputs []Operand, cs []choice, opts Options, cache planCache) (*strategy, error) {
	mesh := given[0].Mesh
	nIn := len(e.in)
	if k.bias {
		nIn--
	}
	s := &strategy{choices: cs, plans: cache}
	outPl := make([]placement.Placement, len(cs))
	for i, c := range cs {
		outPl[i] = place(e, given, i, c, e.out, true, -1)
	}
	out, err := placement.NewSpec(e.shapeOf(e.out), mesh, outPl...)
	if err != nil {
		return nil, err
	}
	s.out = out
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
			if err := s.move(ctx, inputs[j].Name, given[j], local); err != nil {
				return nil, err
			}
		}
		if opts.needsGrad(inputs[j].Name) {
			if err := s.reverse(ctx, given[j], local); err != nil {
				return nil, err
			}
		}
		s.local = append(s.local, local)
	}
	s.work = work(e, s.local, out)
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
	return s, s.move(ctx, "", out, fs)
}

func (s *strategy) move(ctx context.Context, name string, from, to placement.Spec) error {
	steps, err := s.plans.plan(ctx, from, to)
	if err != nil {
		return err
	}
	s.cost = satAdd(s.cost, placement.PlanCost(steps))
	s.steps += len(steps)
	for _, st := range steps {
		if st.Moves() {
			s.moving++
		}
	}
	if len(steps) > 0 {
		s.moves = append(s.moves, Move{Tensor: name, From: from, To: to, Steps: steps})
	}
	return nil
}

// reverse prices the gradient's way back when an input moved from given to
// local: the gradient of a replicated use arrives as partial sums, of a partial
// use replicated, of a shard as the shard, and must reach the dual of given.
func (s *strategy) reverse(ctx context.Context, given, local placement.Spec) error {
	if given.Equal(local) {
		return nil
	}
	target, _, err := dual("", Operand{Spec: given})
	if err != nil {
		return nil // no gradient layout: nothing to price
	}
	nat := slices.Clone(local.Placements)
	for i, p := range nat {
		switch p.(type) {
		case placement.Replicate:
			nat[i] = placement.Partial{Op: placement.Sum}
		case placement.Partial:
			nat[i] = placement.Replicate{}
		}
	}
	from, err := placement.NewSpec(local.Shape, local.Mesh, nat...)
	if err != nil {
		return nil
	}
	steps, err := s.plans.plan(ctx, from, target)
	if err != nil {
		return err
	}
	s.cost = satAdd(s.cost, placement.PlanCost(steps))
	return nil
}

// work is the number of multiply-adds of the local op on the busiest rank: the
// product of the local sizes of every letter.
func work(e einsum, local []placement.Spec, out placement.Spec) int64 {
	var most int64
	terms := append(slices.Clone(e.in), e.out)
	specs := append(slices.Clone(local), out)
	var shape []int
	for r := 0; r < out.Mesh.Size(); r++ {
		var size [256]int64
		var seen [256]bool
		for j, t := range terms {
			shape = specs[j].AppendLocalShape(shape[:0], r)
			for d := range t {
				if t[d] != bcast {
					size[t[d]], seen[t[d]] = int64(shape[d]), true
				}
			}
		}
		w := int64(1)
		for l, ok := range seen {
			if ok {
				w = satMul(w, size[l])
			}
		}
		most = max(most, w)
	}
	return most
}

// satAdd and satMul are a+b and a*b for a, b >= 0, saturating at
// math.MaxInt64: costs and work order strategies; beyond an int64 they all
// compare equal.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if p, ok := placement.MulSize(a, b); ok {
		return p
	}
	return math.MaxInt64
}

// strategyCount is the number of strategies, cands' sizes multiplied, as
// "4x4x4 = 64", or without the product when it overflows.
func strategyCount(cands [][]choice) string {
	parts := make([]string, len(cands))
	n, ok := int64(1), true
	for i, c := range cands {
		parts[i] = strconv.Itoa(len(c))
		if ok {
			n, ok = placement.MulSize(n, int64(len(c)))
		}
	}
	if !ok {
		return strings.Join(parts, "x")
	}
	return strings.Join(parts, "x") + " = " + strconv.FormatInt(n, 10)
}

func describe(op string, inputs []Operand) string {
	parts := make([]string, len(inputs))
	for i, in := range inputs {
		parts[i] = in.String()
	}
	return op + " " + strings.Join(parts, " ")
}
