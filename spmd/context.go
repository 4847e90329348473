package spmd

import (
	"context"

	"github.com/meshrun/meshrun/placement"
)

// ForwardContext is ForwardWith(ctx, placement.PlannerOf(ctx), req), for the
// callers that still carry their planner in a context.
//
// Deprecated: use ForwardWith.
func ForwardContext(ctx context.Context, req Request) (*Plan, error) {
	return ForwardWith(ctx, placement.PlannerOf(ctx), req)
}

// BackwardOfContext is BackwardOfWith(ctx, placement.PlannerOf(ctx), ...),
// for the callers that still carry their planner in a context.
//
// Deprecated: use BackwardOfWith.
func BackwardOfContext(ctx context.Context, fwd *Plan, grads []string, dims []int) (*Backward, error) {
	return BackwardOfWith(ctx, placement.PlannerOf(ctx), fwd, grads, dims)
}
