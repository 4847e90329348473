package stage

import (
	"context"
	"fmt"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/tensor"
)

// Evaluator is a stage's forward alone, for a pass with no backward (a
// held-out loss, sampling): Evaluate runs micro-batch mb from in (nil on
// the first stage) and returns the activation for the next stage (ignored
// on the last), keeping nothing for a backward.
type Evaluator interface {
	Evaluate(ctx context.Context, mb int, in *tensor.Tensor) (*tensor.Tensor, error)
}

// Forward runs the forwards of micro-batches 0 to m−1 on the stages of the
// pp group g, one after another: each stage receives micro-batch mb's
// activation from the one before (host float32 of shape(mb); none on the
// first), evaluates it and sends the result to the one after (the last
// sends nothing). It uses the two-rank groups Run uses with each
// neighbour. The first error fails the group's World, as Run's.
func Forward(ctx context.Context, g *collective.Group, m int, ev Evaluator, shape func(mb int) []int) error {
	if g == nil || ev == nil || shape == nil || m < 0 {
		return fmt.Errorf("%w: a nil group, evaluator or shape, or %d micro-batches", ErrInvalid, m)
	}
	ranks, s := g.Ranks(), g.Index()
	var prev, next *collective.Group
	var err error
	if s > 0 {
		if prev, err = g.World().Group(ctx, []int{ranks[s-1], ranks[s]}); err != nil {
			return err
		}
	}
	if s+1 < len(ranks) {
		if next, err = g.World().Group(ctx, []int{ranks[s], ranks[s+1]}); err != nil {
			return err
		}
	}
	fail := func(err error) error {
		g.World().Fail(err)
		return err
	}
	for mb := range m {
		var in *tensor.Tensor
		if prev != nil {
			in = tensor.New(tensor.Float32, shape(mb)...)
			if err := collective.Recv(ctx, prev, in.Float32(), 0); err != nil {
				return fail(err)
			}
		}
		out, err := ev.Evaluate(ctx, mb, in)
		if err != nil {
			return fail(fmt.Errorf("stage %d: forward of micro-batch %d: %w", s, mb, err))
		}
		if next == nil {
			continue
		}
		if out == nil || out.DType() != tensor.Float32 || out.Len() != tensor.NumElements(shape(mb)) {
			return fail(fmt.Errorf("%w: stage %d: micro-batch %d's activation %v, want float32 %v", ErrInvalid, s, mb, out, shape(mb)))
		}
		if err := collective.Send(ctx, next, out.Float32(), 1); err != nil {
			return fail(err)
		}
	}
	return nil
}
