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
// activation from the one before (of shape(mb), on the evaluator's Wire;
// none on the first), evaluates it and sends the result to the one after
// (the last sends nothing). It uses the links Run uses with each
// neighbour. The first error fails the group's World, as Run's.
func Forward(ctx context.Context, g *collective.Group, m int, ev Evaluator, shape func(mb int) []int) error {
	if g == nil || ev == nil || shape == nil || m < 0 {
		return fmt.Errorf("%w: a nil group, evaluator or shape, or %d micro-batches", ErrInvalid, m)
	}
	s, w := g.Index(), wireOf(ev)
	prev, _, next, _, err := links(ctx, g, w)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		g.World().Fail(err)
		return err
	}
	for mb := range m {
		var in *tensor.Tensor
		if prev != nil {
			if in, err = w.alloc(shape(mb)); err == nil {
				err = prev.recv(ctx, in)
			}
			if err != nil {
				w.free(in)
				return fail(err)
			}
		}
		out, err := ev.Evaluate(ctx, mb, in)
		w.free(in)
		if err != nil {
			return fail(fmt.Errorf("stage %d: forward of micro-batch %d: %w", s, mb, err))
		}
		if next == nil {
			continue
		}
		if msg := w.fits(out, shape(mb)); msg != "" {
			w.free(out)
			return fail(fmt.Errorf("%w: stage %d: micro-batch %d's activation %s", ErrInvalid, s, mb, msg))
		}
		err = next.send(ctx, out)
		w.free(out)
		if err != nil {
			return fail(err)
		}
	}
	return nil
}
