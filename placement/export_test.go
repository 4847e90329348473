package placement

import (
	"context"
	"math"
)

// PlanSearch plans from -> to under m; astar false searches with a zero bound
// (Dijkstra: every layout cheaper than the answer is expanded). It returns the
// layouts expanded.
func PlanSearch(m Model, from, to Spec, astar bool) ([]Step, int, error) {
	w := 0.0
	if astar {
		w = 1
	}
	return PlanWeighted(m, from, to, w)
}

// PlanWeighted plans with the bound weighted by w.
func PlanWeighted(m Model, from, to Spec, w float64) ([]Step, int, error) {
	return planSearch(context.Background(), NewPlanner(m, 1<<40), from, to, w, math.MaxInt64)
}

// Bound is the search's lower bound from from to to under m.
func Bound(m Model, from, to Spec) Picos {
	n, _ := ShapeElems(from.Shape)
	return bound(m, from.Mesh.Shape(), float64(n), len(from.Shape), from.Placements, to.Placements)
}

// Canonical is the search's fallback plan.
var Canonical = canonical

// Uniform exposes uniform to the tests.
func (s Spec) Uniform() bool { return s.uniform() }
