package placement

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Plan returns the cheapest sequence of steps that turns a tensor laid out as
// from into one laid out as to under DefaultModel, within DefaultBudget: see
// Planner.Plan, here with a DefaultPlanner of its own.
func Plan(from, to Spec) ([]Step, error) {
	return DefaultPlanner().Plan(context.Background(), from, to)
}

// Plan returns the cheapest sequence of steps that turns a tensor laid out as
// from into one laid out as to under p's Model: the least modelled time, then
// the fewest collectives, then the fewest steps, then the first in a fixed
// order. It is an A* search over layouts with an admissible, consistent bound
// (see bound), so it returns an optimal plan among every order of every step
// moves offers — single-dim collectives, all-to-alls, flattened groups over
// several mesh dims, local slices — while expanding only the layouts that
// could lie on a cheaper path. A mesh dim that goes from Shard to Partial is
// an error (ErrNoPath). It stops with ctx's error once ctx is done, and draws
// its work from p's budget, stopping with an error wrapping ErrBudget when it
// runs out; a plan p's cache holds costs nothing. A nil p is a
// DefaultPlanner.
func (p *Planner) Plan(ctx context.Context, from, to Spec) ([]Step, error) {
	steps, _, err := planSearch(ctx, p.orDefault(), from, to, 1, math.MaxInt64)
	return steps, err
}

// PlanWithin is Plan for planners that only need plans cheaper than limit (a
// strategy search that has a cheaper strategy in hand): once every plan left
// takes more than limit, it stops and returns an error for which AboveLimit
// reports a lower bound on the cheapest plan's time. Another call with a
// planner sharing p's cache and a higher limit resumes the search where this
// one stopped.
func (p *Planner) PlanWithin(ctx context.Context, from, to Spec, limit Picos) ([]Step, error) {
	steps, _, err := planSearch(ctx, p.orDefault(), from, to, 1, limit)
	return steps, err
}

// AboveLimit reports whether err is PlanWithin's error for a plan above its
// limit, and the lower bound it proved on the plan's time.
func AboveLimit(err error) (Picos, bool) {
	var ab *above
	if errors.As(err, &ab) {
		return ab.lb, true
	}
	return 0, false
}

// planSearch plans with the bound weighted by weight: 1 is A*, 0 Dijkstra
// (for tests to compare), more than 1 trades optimality for speed. It also
// returns the number of layouts expanded.
func planSearch(ctx context.Context, pl *Planner, from, to Spec, weight float64, limit Picos) ([]Step, int, error) {
	if err := from.Validate(); err != nil {
		return nil, 0, err
	}
	if err := to.Validate(); err != nil {
		return nil, 0, err
	}
	if !from.Mesh.Equal(to.Mesh) || !slices.Equal(from.Shape, to.Shape) {
		return nil, 0, fmt.Errorf("%w: plan %s on %s -> %s on %s: shape or mesh differs", ErrInvalid, from, from.Mesh, to, to.Mesh)
	}
	for i := range from.Placements {
		_, fs := from.Placements[i].(Shard)
		_, tp := to.Placements[i].(Partial)
		if fs && tp {
			return nil, 0, fmt.Errorf("%w: plan %s -> %s: mesh dim %s goes from %s to %s (S -> P)",
				ErrNoPath, from, to, from.Mesh.DimName(i), from.Placements[i], to.Placements[i])
		}
	}
	m := pl.model
	if err := m.Validate(); err != nil {
		return nil, 0, err
	}
	key := fmt.Sprintf("placement|%s %s>%s %v %v", from.Mesh, from, FormatList(to.Placements), m, weight)
	p, ok := pl.recallPlanned(key)
	if ok && p.search == nil {
		return p.steps, p.expanded, p.err
	}
	if !ok {
		p.search = newSearch(m, from, to, weight)
	}
	steps, err := p.search.run(ctx, pl, limit)
	var ab *above
	if errors.As(err, &ab) {
		pl.Remember(key, planned{search: p.search})
		return nil, p.search.expanded, err
	}
	if err != nil && !errors.Is(err, ErrNoPath) {
		return nil, p.search.expanded, fmt.Errorf("%w (plan %s -> %s on %s)", err, from, to, from.Mesh)
	}
	pl.Remember(key, planned{steps: steps, err: err, expanded: p.search.expanded})
	return steps, p.search.expanded, err
}
