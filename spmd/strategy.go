package spmd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/meshrun/meshrun/placement"
)

// strategy is one choice per mesh dim, priced: the layouts the local op
// reads and writes, the moves around it and what they cost.
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
	plans   moveCache
	index   []int // the choices' indices, for ties
	ring    *Ring // ring attention's transfers, nil without
}

// moveCache plans the redistributions of a solve's strategies, with their
// prices, through the planner's cache: strategies share most of their
// moves, and the ops of a model many.
type moveCache struct {
	pl     *placement.Planner
	prefix string // the cache key's start: the package, the model and the mesh
}

// newMoveCache plans the moves of a solve on mesh: a spec's string leaves
// its mesh out, the key must not.
func newMoveCache(pl *placement.Planner, mesh placement.Mesh) moveCache {
	return moveCache{pl: pl, prefix: fmt.Sprintf("spmd|move|%v|%s|", pl.Model(), mesh)}
}

// cachedPlan is one redistribution plan with its prices, computed once:
// pricing a plan's bytes visits every rank of the mesh. A plan searched only
// up to a limit (because every strategy needing it was pruned) keeps the
// lower bound the search proved. It is shared, never changed.
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
func (c moveCache) plan(ctx context.Context, from, to placement.Spec, limit placement.Picos) (*cachedPlan, error) {
	k := c.prefix + from.String() + ">" + to.String()
	v, ok := c.pl.Recall(k)
	p, _ := v.(*cachedPlan)
	if ok && p.above == 0 {
		return p, p.err
	}
	if ok && p.above > limit {
		return nil, errPruned
	}
	steps, err := c.pl.PlanWithin(ctx, from, to, limit)
	if lb, ok := placement.AboveLimit(err); ok {
		c.pl.Remember(k, &cachedPlan{above: max(lb, 1)})
		return nil, errPruned
	}
	if stopped(err) {
		return nil, err
	}
	p = &cachedPlan{steps: steps, err: err}
	if err == nil {
		p.bytes = placement.PlanCost(steps)
		p.time = c.pl.Model().PlanTime(steps)
		for _, st := range steps {
			if st.Moves() {
				p.moving++
			}
		}
	}
	c.pl.Remember(k, p)
	return p, err
}

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

func (s *strategy) candidate(mesh placement.Mesh, e einsum) Candidate {
	c := Candidate{Output: s.out.Placements, Cost: s.cost, Collectives: s.moving, Steps: s.steps, Work: s.work, Costs: s.costs}
	for i, ch := range s.choices {
		c.Strategy = append(c.Strategy, mesh.DimName(i)+": "+ch.label(e))
	}
	return c
}

// price builds one strategy's layouts and prices its redistributions.
func price(ctx context.Context, e einsum, k kind, given []placement.Spec, inputs []Operand, cs []choice, opts Options, cache moveCache, limit placement.Picos) (*strategy, error) {
	mesh := given[0].Mesh
	nIn := len(e.in)
	if k.bias {
		nIn--
	}
	s := &strategy{choices: cs, plans: cache, model: cache.pl.Model()}
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
	if err := s.priceRing(k, inputs, opts); err != nil {
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
			if c.splits(l) {
				q *= int64(mesh.Dim(i))
			}
		}
		w = placement.SatMul(w, (int64(e.size[l])+q-1)/q)
	}
	return w
}
