package placement

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Plan returns the cheapest sequence of steps that turns a tensor laid out as
// from into one laid out as to under the context's Model (DefaultModel for
// Plan): the least modelled time, then the fewest collectives, then the fewest
// steps, then the first in a fixed order. It is an A* search over layouts
// with an admissible, consistent bound (see bound), so it returns an optimal
// plan among every order of every step moves offers — single-dim
// collectives, all-to-alls, flattened groups over several mesh dims, local
// slices — while expanding only the layouts that could lie on a cheaper
// path. A mesh dim that goes from Shard to Partial is an error (ErrNoPath).
// The search does at most DefaultBudget units of work (ErrBudget beyond).
func Plan(from, to Spec) ([]Step, error) { return PlanContext(context.Background(), from, to) }

// PlanContext is Plan within ctx: priced by ctx's Model (WithModel), it stops
// with ctx's error once ctx is done, and draws its work from ctx's Budget
// (WithBudget; a fresh DefaultBudget when ctx carries none), stopping with an
// error wrapping ErrBudget when it runs out.
func PlanContext(ctx context.Context, from, to Spec) ([]Step, error) {
	steps, _, err := planSearch(ctx, from, to, 1, math.MaxInt64)
	return steps, err
}

// PlanWithin is PlanContext for planners that only need plans cheaper than
// limit (a strategy search that has a cheaper strategy in hand): once every
// plan left takes more than limit, it stops and returns an error for which
// AboveLimit reports a lower bound on the cheapest plan's time. Another call
// under the same Budget with a higher limit resumes the search where this
// one stopped.
func PlanWithin(ctx context.Context, from, to Spec, limit Picos) ([]Step, error) {
	steps, _, err := planSearch(ctx, from, to, 1, limit)
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
func planSearch(ctx context.Context, from, to Spec, weight float64, limit Picos) ([]Step, int, error) {
	if err := from.Validate(); err != nil {
		return nil, 0, err
	}
	if err := to.Validate(); err != nil {
		return nil, 0, err
	}
	if !from.Mesh.Equal(to.Mesh) || !slices.Equal(from.Shape, to.Shape) {
		return nil, 0, fmt.Errorf("placement: plan %s on %s -> %s on %s: shape or mesh differs: %w",
			from, from.Mesh, to, to.Mesh, ErrInvalid)
	}
	for i := range from.Placements {
		_, fs := from.Placements[i].(Shard)
		_, tp := to.Placements[i].(Partial)
		if fs && tp {
			return nil, 0, fmt.Errorf("placement: plan %s -> %s: mesh dim %s goes from %s to %s (S -> P): %w",
				from, to, from.Mesh.DimName(i), from.Placements[i], to.Placements[i], ErrNoPath)
		}
	}
	m := ModelOf(ctx)
	if err := m.Validate(); err != nil {
		return nil, 0, err
	}
	b, ctx := BudgetOf(ctx)
	key := fmt.Sprintf("%s %s>%s %v %v", from.Mesh, from, FormatList(to.Placements), m, weight)
	p, ok := b.recall(key)
	if ok && p.search == nil {
		return p.steps, p.expanded, p.err
	}
	if !ok {
		p.search = newSearch(m, from, to, weight)
	}
	steps, err := p.search.run(ctx, b, limit)
	var ab *above
	if errors.As(err, &ab) {
		b.remember(key, planned{search: p.search})
		return nil, p.search.expanded, err
	}
	if err != nil && !errors.Is(err, ErrNoPath) {
		return nil, p.search.expanded, fmt.Errorf("placement: plan %s -> %s on %s: %w", from, to, from.Mesh, err)
	}
	b.remember(key, planned{steps: steps, err: err, expanded: p.search.expanded})
	return steps, p.search.expanded, err
}
