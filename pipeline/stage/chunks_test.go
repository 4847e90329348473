package stage_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/job"
	"github.com/meshrun/meshrun/pipeline"
	"github.com/meshrun/meshrun/pipeline/stage"
	"github.com/meshrun/meshrun/tensor"
)

// wired is a toy stage on a wire of its own.
type wired struct {
	*linear
	w stage.Wire
}

func (w wired) Wire() stage.Wire { return w.w }

// evaluator is a toy stage's forward alone (stage.Evaluator).
type evaluator struct{ *linear }

func (e evaluator) Evaluate(ctx context.Context, mb int, in *tensor.Tensor) (*tensor.Tensor, error) {
	return e.Forward(ctx, mb, in)
}

// TestInterleavedMatchesReference: the interleaved 1F1B on p = 2, 3 and 4
// stages of v = 2 and 3 chunks (the toy's p·v virtual stages, stage s
// holding s, s+p, …), m = p and 2p: every virtual stage's weight gradients,
// the first's input gradients and the last's outputs match the float64
// reference within 1e-5 relative; each stage ran its order and held what
// the order implies; the messages go round the ring (2m·v a stage, less
// the first virtual stage's and the last's m); a forward pass alone
// (ForwardChunks) gives the same outputs.
func TestInterleavedMatchesReference(t *testing.T) {
	for _, p := range []int{2, 3, 4} {
		for _, v := range []int{2, 3} {
			for _, m := range []int{p, 2 * p} {
				name := fmt.Sprintf("p=%d v=%d m=%d", p, v, m)
				tm := newToy(p*v, m, uint64(100*p+10*v+m))
				sched, err := pipeline.ScheduleChunks(pipeline.Interleaved, p, m, v)
				if err != nil {
					t.Fatal(err)
				}
				model, err := pipeline.RunChunks(pipeline.Interleaved, p, m, v, pipeline.Cost{F: 1, B: 1, W: 1})
				if err != nil {
					t.Fatal(err)
				}
				chunks := make([][]*linear, p)
				traces := make([]stage.Trace, p)
				evals := make([][]*linear, p)
				err = job.InProcess(context.Background(), p, func(ctx context.Context, w *collective.World) error {
					g, err := w.WorldGroup(ctx)
					if err != nil {
						return err
					}
					s := g.Index()
					var sts []stage.Stage
					var eva []stage.Evaluator
					for c := range v {
						l := newLinear(tm, c*p+s)
						chunks[s] = append(chunks[s], l)
						sts = append(sts, l)
						e := newLinear(tm, c*p+s)
						evals[s] = append(evals[s], e)
						eva = append(eva, evaluator{e})
					}
					if traces[s], err = stage.RunChunks(ctx, g, pipeline.Interleaved, sched, sts, shape); err != nil {
						return err
					}
					return stage.ForwardChunks(ctx, g, m, eva, shape)
				})
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				for s := range p {
					for c, l := range chunks[s] {
						u := c*p + s
						if e := relErr(l.dw, tm.dw[u]); e > 1e-5 {
							t.Errorf("%s: virtual stage %d: dW off by %g relative", name, u, e)
						}
						if len(l.x)+len(l.g) != 0 {
							t.Errorf("%s: virtual stage %d: %d inputs and %d gradients left", name, u, len(l.x), len(l.g))
						}
					}
					tr := traces[s]
					if got := tr.Actions(); !slices.Equal(got, sched[s]) {
						t.Errorf("%s stage %d: ran %v, scheduled %v", name, s, got, sched[s])
					}
					checkTrace(t, name, tr)
					if tr.Peak != model.Peak[s] {
						t.Errorf("%s stage %d: peak %d, the order implies %d", name, s, tr.Peak, model.Peak[s])
					}
					want := 2 * m * v
					if s == 0 || s == p-1 {
						want -= m
					}
					if tr.Sent != want || tr.Received != want {
						t.Errorf("%s stage %d: sent %d, received %d; want %d each", name, s, tr.Sent, tr.Received, want)
					}
				}
				first, last, eval := chunks[0][0], chunks[p-1][v-1], evals[p-1][v-1]
				for mb := range m {
					if e := relErr(first.dx[mb], tm.dx[mb]); e > 1e-5 {
						t.Errorf("%s: micro-batch %d: dx off by %g relative", name, mb, e)
					}
					if e := relErr(last.out[mb], tm.out[mb]); e > 1e-5 {
						t.Errorf("%s: micro-batch %d: output off by %g relative", name, mb, e)
					}
					if e := relErr(eval.out[mb], tm.out[mb]); e > 1e-5 {
						t.Errorf("%s: micro-batch %d: the forward pass's output off by %g relative", name, mb, e)
					}
				}
			}
		}
	}
}

// TestOrdersThatDisagree: a stage may take its neighbour's tensors in
// another order than sent (stage 1 runs F1 before F0, and B1 before B0,
// under GPipe): each is received in the order sent, into its action's
// slot, and the run matches the float64 reference.
func TestOrdersThatDisagree(t *testing.T) {
	const p, m = 2, 3
	sched, _ := pipeline.Schedule(pipeline.GPipe, p, m)
	sched[1][0], sched[1][1] = sched[1][1], sched[1][0] // F1 before F0
	b0, b1 := slices.Index(sched[1], pipeline.Action{Op: 'B', MB: 0}), slices.Index(sched[1], pipeline.Action{Op: 'B', MB: 1})
	sched[1][b0], sched[1][b0+1], sched[1][b1], sched[1][b1+1] = sched[1][b1], sched[1][b1+1], sched[1][b0], sched[1][b0+1] // B1 W1 before B0 W0
	if err := pipeline.Check(sched, p, m); err != nil {
		t.Fatal(err)
	}
	tm := newToy(p, m, 5)
	res := make([]result, p)
	err := job.InProcess(context.Background(), p, func(ctx context.Context, w *collective.World) error {
		g, err := w.WorldGroup(ctx)
		if err != nil {
			return err
		}
		l := newLinear(tm, g.Index())
		tr, err := stage.Run(ctx, g, pipeline.GPipe, sched, l, shape)
		res[g.Index()] = result{st: l, tr: tr, err: err}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for s, r := range res {
		if e := relErr(r.st.dw, tm.dw[s]); e > 1e-5 {
			t.Errorf("stage %d: dW off by %g relative", s, e)
		}
		if got := r.tr.Actions(); !slices.Equal(got, sched[s]) {
			t.Errorf("stage %d: ran %v, scheduled %v", s, got, sched[s])
		}
	}
	for mb := range m {
		if e := relErr(res[0].st.dx[mb], tm.dx[mb]); e > 1e-5 {
			t.Errorf("micro-batch %d: dx off by %g relative", mb, e)
		}
	}
}
