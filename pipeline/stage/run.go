package stage

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/pipeline"
	"github.com/meshrun/meshrun/tensor"
)

// Run executes this stage's order (sched[s] of pipeline.Schedule(kind, p, m))
// on the pp group g, this stage being g's index s, and returns what it
// measured.
//
// After each F the activation goes to stage s+1; the gradient goes to stage
// s−1 after each B, or, for a fused kind (kind.Fused: GPipe and 1F1B), after
// the micro-batch's W, as a backward that runs B and W as one would send it.
// The activation and the gradient of micro-batch mb are host float32 tensors
// of shape(mb) both ways; shape is called from several goroutines and must
// give the same answer each time. The tensors Forward and BackwardInput
// return are sent as they are: the stage must not change them afterwards.
//
// Sends never hold the compute back: a goroutine per neighbour posts them in
// order. A goroutine per neighbour receives, ahead of the compute, in the
// order the stage's F (from s−1) and B (from s+1) will consume. Each
// neighbour has a two-rank group of its own, so traffic with one never waits
// behind traffic with the other, even on a transport that holds a send until
// it is received (shared memory or TCP past their buffers); Run checks that
// each stage sends in the order its neighbour receives in.
//
// The first error ends the run: a Stage method's (wrapped, naming the stage
// and the action), or a send's or receive's, the collective layer's error
// naming the peer that died or timed out. Run then fails the group's World
// with it, if the collective layer has not already, so that the neighbours,
// waiting on this stage, fail too instead of waiting for their deadline; it
// stops its goroutines and returns the error with the trace so far.
func Run(ctx context.Context, g *collective.Group, kind pipeline.Kind, sched [][]pipeline.Action, st Stage, shape func(mb int) []int) (Trace, error) {
	if err := validate(g, kind, sched, st, shape); err != nil {
		return Trace{}, err
	}
	p, s, m := len(sched), g.Index(), len(sched[0])/3
	r := &runner{g: g, s: s, p: p, fused: kind.Fused(), order: sched[s], st: st, shape: shape,
		acts: slots(m), grads: slots(m), wire: wireOf(st)}
	// Links of their own per neighbour: a send to one neighbour never
	// waits behind a send to, or a receive from, the other (a host group
	// runs one send and one receive at a time, and a transport may hold a
	// send until it is received); on a device wire, one per direction.
	var err error
	if r.actIn, r.gradOut, r.actOut, r.gradIn, err = links(ctx, g, r.wire); err != nil {
		return Trace{}, err
	}
	r.ctx, r.cancel = context.WithCancelCause(ctx)
	defer r.cancel(nil)

	start := time.Now()
	toNext, toPrev := make(chan sending, m), make(chan sending, m)
	r.start = start
	r.wg.Add(4)
	go r.receive('F', r.actIn, r.acts)
	go r.receive('B', r.gradIn, r.grads)
	go r.send(toNext, r.actOut, s+1)
	go r.send(toPrev, r.gradOut, s-1)

	tr := Trace{Stage: s, Kind: kind}
	if err := r.compute(start, toNext, toPrev, &tr); err != nil {
		r.fail(err)
	}
	close(toNext)
	close(toPrev)
	r.wg.Wait()
	tr.Total = time.Since(start)
	tr.Sent, tr.Received = int(r.sent.Load()), int(r.received.Load())
	r.mu.Lock()
	tr.Sends = r.sends
	r.mu.Unlock()
	slices.SortFunc(tr.Sends, func(a, b Send) int { return int(a.Start - b.Start) })
	tr.finish()
	return tr, r.err()
}

// runner is one Run in flight.
type runner struct {
	g        *collective.Group
	wire     Wire
	actIn    *link // from stage s−1; nil on the first
	gradOut  *link // to stage s−1; nil on the first
	actOut   *link // to stage s+1; nil on the last
	gradIn   *link // from stage s+1; nil on the last
	s, p     int
	fused    bool
	order    []pipeline.Action
	st       Stage
	shape    func(int) []int
	ctx      context.Context
	cancel   context.CancelCauseFunc
	wg       sync.WaitGroup
	mu       sync.Mutex
	first    error
	failed   bool
	acts     []chan *tensor.Tensor // per micro-batch, from stage s−1
	grads    []chan *tensor.Tensor // per micro-batch, from stage s+1
	sent     atomic.Int64
	received atomic.Int64
	start    time.Time
	sends    []Send // under mu
}

// sending is a tensor to send and the action that made it.
type sending struct {
	t *tensor.Tensor
	a pipeline.Action
}

func slots(m int) []chan *tensor.Tensor {
	c := make([]chan *tensor.Tensor, m)
	for i := range c {
		c[i] = make(chan *tensor.Tensor, 1)
	}
	return c
}

// fail records the run's first error, fails the World with it unless the
// collective layer already did (its errors are *collective.Error), and
// cancels the run's context.
func (r *runner) fail(err error) {
	r.mu.Lock()
	if r.failed {
		r.mu.Unlock()
		return
	}
	r.failed, r.first = true, err
	r.mu.Unlock()
	if ce := (*collective.Error)(nil); !errors.As(err, &ce) {
		r.g.World().Fail(err)
	}
	r.cancel(err)
}

func (r *runner) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.first
}

// receive receives on link l every tensor the stage's op actions consume
// (F: activations from s−1; B: gradients from s+1), in their order;
// nothing without the neighbour.
func (r *runner) receive(op byte, l *link, into []chan *tensor.Tensor) {
	defer r.wg.Done()
	if l == nil {
		return
	}
	for _, a := range r.order {
		if a.Op != op {
			continue
		}
		if r.ctx.Err() != nil {
			return
		}
		t, err := r.wire.alloc(r.shape(a.MB))
		if err == nil {
			err = l.recv(r.ctx, t)
		}
		if err != nil {
			r.wire.free(t)
			r.fail(err)
			return
		}
		r.received.Add(1)
		into[a.MB] <- t
	}
}

// send sends what q carries on link l (to stage to), in order, until q is
// closed, recording each send's time, and gives a device wire's tensors
// back once sent; after a failure, or without the neighbour, it only
// drains q.
func (r *runner) send(q <-chan sending, l *link, to int) {
	defer r.wg.Done()
	for x := range q {
		if r.ctx.Err() != nil || l == nil {
			r.wire.free(x.t)
			continue
		}
		begin := time.Since(r.start)
		err := l.send(r.ctx, x.t)
		r.wire.free(x.t)
		if err != nil {
			r.fail(err)
			continue
		}
		r.sent.Add(1)
		r.mu.Lock()
		r.sends = append(r.sends, Send{Action: x.a, To: to, Start: begin, End: time.Since(r.start)})
		r.mu.Unlock()
	}
}

// input waits for micro-batch mb's tensor in from, or for the run's end.
func (r *runner) input(from []chan *tensor.Tensor, mb int) (*tensor.Tensor, error) {
	select {
	case t := <-from[mb]:
		return t, nil
	case <-r.ctx.Done():
		return nil, context.Cause(r.ctx)
	}
}

// compute runs the stage's actions in order, queueing the sends.
func (r *runner) compute(start time.Time, toNext, toPrev chan<- sending, tr *Trace) error {
	first, last := r.s == 0, r.s+1 == r.p
	held := 0
	pending := map[int]sending{} // fused: gradients sent after their W
	for _, a := range r.order {
		if r.ctx.Err() != nil {
			return context.Cause(r.ctx)
		}
		ready := time.Since(start)
		var in *tensor.Tensor
		var err error
		switch {
		case a.Op == 'F' && !first:
			in, err = r.input(r.acts, a.MB)
		case a.Op == 'B' && !last:
			in, err = r.input(r.grads, a.MB)
		}
		if err != nil {
			return err
		}
		begin := time.Since(start)
		var end time.Duration // when the action's work ended (before its send is queued)
		switch a.Op {
		case 'F':
			out, err := r.st.Forward(r.ctx, a.MB, in)
			end = time.Since(start)
			if err != nil {
				return fmt.Errorf("stage %d: %v: %w", r.s, a, err)
			}
			if !last {
				if err := r.check(out, a); err != nil {
					return err
				}
				toNext <- sending{out, a}
				runtime.Gosched() // the sender posts it now, not after the next action (one core: GOMAXPROCS=1)
			}
			held++
			tr.Peak = max(tr.Peak, held)
		case 'B':
			out, err := r.st.BackwardInput(r.ctx, a.MB, in)
			end = time.Since(start)
			if err != nil {
				return fmt.Errorf("stage %d: %v: %w", r.s, a, err)
			}
			if !first {
				if err := r.check(out, a); err != nil {
					return err
				}
				if r.fused {
					pending[a.MB] = sending{out, a}
				} else {
					toPrev <- sending{out, a}
					runtime.Gosched()
				}
			}
		case 'W':
			err := r.st.BackwardWeight(r.ctx, a.MB)
			end = time.Since(start)
			if err != nil {
				return fmt.Errorf("stage %d: %v: %w", r.s, a, err)
			}
			if out, ok := pending[a.MB]; ok {
				toPrev <- out
				runtime.Gosched()
				delete(pending, a.MB)
			}
			held--
		}
		r.wire.free(in) // the stage keeps none of what it is given
		tr.Events = append(tr.Events, Event{Action: a, Start: begin, End: end, Wait: begin - ready})
	}
	return nil
}

// check holds what the stage returned for a to the wire and the
// neighbour's shape.
func (r *runner) check(t *tensor.Tensor, a pipeline.Action) error {
	what := "an activation"
	if a.Op == 'B' {
		what = "a gradient"
	}
	if t == nil {
		return fmt.Errorf("%w: stage %d: %v returned no tensor for %s", ErrInvalid, r.s, a, what)
	}
	if msg := r.wire.fits(t, r.shape(a.MB)); msg != "" {
		return fmt.Errorf("%w: stage %d: %v returned %s %s", ErrInvalid, r.s, a, what, msg)
	}
	return nil
}

// finish derives the totals from the events.
func (t *Trace) finish() {
	for _, e := range t.Events {
		t.Busy += e.End - e.Start
		t.Makespan = max(t.Makespan, e.End)
	}
	t.Idle = t.Makespan - t.Busy
	if t.Makespan > 0 {
		t.Bubble = float64(t.Idle) / float64(t.Makespan)
	}
}
