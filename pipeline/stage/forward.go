package stage

import (
	"context"
	"fmt"
	"slices"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/pipeline"
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
	return ForwardChunks(ctx, g, m, []Evaluator{ev}, shape)
}

// ForwardChunks is Forward over chunks (RunChunks'): each micro-batch goes
// through the virtual stages in order, stage s evaluating it with chunk c
// at virtual stage c·p+s, round the ring of stages v times.
func ForwardChunks(ctx context.Context, g *collective.Group, m int, evs []Evaluator, shape func(mb int) []int) error {
	if g == nil || len(evs) == 0 || slices.Contains(evs, nil) || shape == nil || m < 0 {
		return fmt.Errorf("%w: a nil group, evaluator or shape, or %d micro-batches", ErrInvalid, m)
	}
	s, p, v, w := g.Index(), g.Size(), len(evs), wireOf(evs[0])
	prev, next, err := links(ctx, g, w, v > 1)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		g.World().Fail(err)
		return err
	}
	for mb := range m {
		for c, ev := range evs {
			u := pipeline.Virtual(p, s, c)
			var in *tensor.Tensor
			if u > 0 {
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
			if u == p*v-1 {
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
	}
	return nil
}
