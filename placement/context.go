package placement

import "context"

// The planning state used to travel in a context. The functions below carry
// a Planner in one for the callers that do not pass it yet (the launcher's
// plan command); the planning functions themselves take a *Planner, and
// nothing else reads a context for one.

type plannerKey struct{}

// WithBudget returns a context carrying a planner that may do n units of
// work, priced by the model ctx carries, with a cache of its own.
//
// Deprecated: pass NewPlanner(m, n) to the planning functions.
func WithBudget(ctx context.Context, n int64) context.Context {
	return context.WithValue(ctx, plannerKey{}, NewPlanner(ModelOf(ctx), n))
}

// WithModel returns a context whose planner prices plans by m: the planner
// ctx carries with its budget and cache, or, without one, m alone (each plan
// made under it then gets a DefaultBudget of its own, as PlannerOf says).
//
// Deprecated: pass a Planner (NewPlanner, Planner.WithModel).
func WithModel(ctx context.Context, m Model) context.Context {
	if p, ok := ctx.Value(plannerKey{}).(*Planner); ok && p.budget != nil {
		return context.WithValue(ctx, plannerKey{}, p.WithModel(m))
	}
	return context.WithValue(ctx, plannerKey{}, &Planner{model: m})
}

// PlannerOf returns the planner ctx carries, or, where ctx carries none (or
// only a model, WithModel), a new one of that model (DefaultModel) and
// DefaultBudget.
//
// Deprecated: pass the Planner itself.
func PlannerOf(ctx context.Context) *Planner {
	p, ok := ctx.Value(plannerKey{}).(*Planner)
	switch {
	case !ok:
		return DefaultPlanner()
	case p.budget == nil:
		return NewPlanner(p.model, DefaultBudget)
	}
	return p
}

// ModelOf returns the model of ctx's planner (DefaultModel without one).
//
// Deprecated: use Planner.Model.
func ModelOf(ctx context.Context) Model {
	if p, ok := ctx.Value(plannerKey{}).(*Planner); ok {
		return p.model
	}
	return DefaultModel
}

// PlanContext is PlannerOf(ctx).Plan(ctx, from, to).
//
// Deprecated: use Planner.Plan.
func PlanContext(ctx context.Context, from, to Spec) ([]Step, error) {
	return PlannerOf(ctx).Plan(ctx, from, to)
}
