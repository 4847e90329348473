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
// order the neighbour sends (its F's activations, its B's gradients), each
// into the slot of the action that takes it, so a send never waits on what
// the stage computes. Each neighbour has a two-rank group of its own, so
// traffic with one never waits behind traffic with the other, even on a
// transport that holds a send until it is received (shared memory or TCP
// past their buffers).
//
// The first error ends the run: a Stage method's (wrapped, naming the stage
// and the action), or a send's or receive's, the collective layer's error
// naming the peer that died or timed out. Run then fails the group's World
// with it, if the collective layer has not already, so that the neighbours,
// waiting on this stage, fail too instead of waiting for their deadline; it
// stops its goroutines and returns the error with the trace so far.
func Run(ctx context.Context, g *collective.Group, kind pipeline.Kind, sched [][]pipeline.Action, st Stage, shape func(mb int) []int) (Trace, error) {
	return RunChunks(ctx, g, kind, sched, []Stage{st}, shape)
}

// RunChunks is Run for a schedule of chunks (pipeline.ScheduleChunks:
// Interleaved): chunks[c] is the stage's chunk c, virtual stage c·p+s of
// p·v. An activation goes to stage s+1 (from the last stage, to stage 0's
// next chunk), a gradient to stage s−1 (from stage 0, to the last stage's
// chunk before): the stages send round a ring.
func RunChunks(ctx context.Context, g *collective.Group, kind pipeline.Kind, sched [][]pipeline.Action, chunks []Stage, shape func(mb int) []int) (Trace, error) {
	if err := validate(g, sched, chunks, shape); err != nil {
		return Trace{}, err
	}
	p, s, v := len(sched), g.Index(), len(chunks)
	m := len(sched[0]) / (3 * v)
	r := &runner{g: g, s: s, p: p, v: v, m: m, fused: kind.Fused(), order: sched[s], chunks: chunks, shape: shape,
		acts: slots(m * v), grads: slots(m * v), wire: wireOf(chunks[0])}
	// A link of its own per neighbour: a send to one neighbour never waits
	// behind a send to, or a receive from, the other (a host group runs
	// one send and one receive at a time, and a transport may hold a send
	// until it is received); on a device wire, a communicator per
	// direction.
	prev, next, err := links(ctx, g, r.wire, v > 1)
	if err != nil {
		return Trace{}, err
	}
	var ns []*neighbour
	if prev != nil {
		r.prev = &neighbour{l: prev, stage: (s - 1 + p) % p, out: make(chan sending, 2*m*v), takes: takesFrom(sched, kind, (s-1+p)%p, s)}
		ns = append(ns, r.prev)
	}
	switch {
	case next != nil && next == prev: // of two stages round a ring, each is the other's both ways
		r.next = r.prev
	case next != nil:
		r.next = &neighbour{l: next, stage: (s + 1) % p, out: make(chan sending, 2*m*v), takes: takesFrom(sched, kind, (s+1)%p, s)}
		ns = append(ns, r.next)
	}
	r.ctx, r.cancel = context.WithCancelCause(ctx)
	defer r.cancel(nil)

	start := time.Now()
	r.start = start
	for _, nb := range ns {
		r.wg.Add(2)
		go r.receive(nb)
		go r.send(nb)
	}

	tr := Trace{Stage: s, Kind: kind}
	if err := r.compute(start, &tr); err != nil {
		r.fail(err)
	}
	for _, nb := range ns {
		close(nb.out)
	}
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
	prev     *neighbour // stage s−1 (round the ring with chunks); nil on the first without
	next     *neighbour // stage s+1; nil on the last without chunks; prev itself of two round a ring
	s, p     int
	v, m     int // chunks per stage, micro-batches
	fused    bool
	order    []pipeline.Action
	chunks   []Stage
	shape    func(int) []int
	ctx      context.Context
	cancel   context.CancelCauseFunc
	wg       sync.WaitGroup
	mu       sync.Mutex
	first    error
	failed   bool
	acts     []chan *tensor.Tensor // per chunk and micro-batch (c·m+mb), from stage s−1
	grads    []chan *tensor.Tensor // per chunk and micro-batch, from stage s+1
	sent     atomic.Int64
	received atomic.Int64
	start    time.Time
	sends    []Send // under mu
}

// neighbour is the traffic with one neighbouring stage: the link, what
// this stage sends it in the order computed, and the actions of this stage
// that take what it sends, in the order it sends them (activations from
// the stage before, gradients from the one after; of two stages round a
// ring, both from the one).
type neighbour struct {
	l     *link
	stage int
	out   chan sending
	takes []pipeline.Action
}

// takesFrom is the actions of stage me that take what stage q sends it,
// in q's order: q's activation of virtual stage u goes to u+1's F, its
// gradient (after B, or a fused kind's W) to u−1's B.
func takesFrom(sched [][]pipeline.Action, kind pipeline.Kind, q, me int) []pipeline.Action {
	p := len(sched)
	n := p * pipeline.Chunks(sched)
	sends := byte('B')
	if kind.Fused() {
		sends = 'W'
	}
	var out []pipeline.Action
	for _, a := range sched[q] {
		u := pipeline.Virtual(p, q, a.Chunk)
		var op byte
		switch {
		case a.Op == 'F' && u+1 < n:
			op, u = 'F', u+1
		case a.Op == sends && u > 0:
			op, u = 'B', u-1
		default:
			continue
		}
		if s, c := pipeline.Place(p, u); s == me {
			out = append(out, pipeline.Action{Op: op, MB: a.MB, Chunk: c})
		}
	}
	return out
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

// receive receives from neighbour nb, ahead of the compute, every tensor
// the stage's actions take from it, in the order nb sends them.
func (r *runner) receive(nb *neighbour) {
	defer r.wg.Done()
	for _, a := range nb.takes {
		if r.ctx.Err() != nil {
			return
		}
		t, err := r.wire.alloc(r.shape(a.MB))
		if err == nil {
			err = nb.l.recv(r.ctx, t)
		}
		if err != nil {
			r.wire.free(t)
			r.fail(err)
			return
		}
		r.received.Add(1)
		into := r.acts
		if a.Op == 'B' {
			into = r.grads
		}
		into[a.Chunk*r.m+a.MB] <- t
	}
}

// send sends what the stage queues for neighbour nb, in order, until the
// queue is closed, recording each send's time, and gives a device wire's
// tensors back once sent; after a failure it only drains the queue.
func (r *runner) send(nb *neighbour) {
	defer r.wg.Done()
	to := nb.stage
	for x := range nb.out {
		if r.ctx.Err() != nil {
			r.wire.free(x.t)
			continue
		}
		begin := time.Since(r.start)
		err := nb.l.send(r.ctx, x.t)
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

// input waits for a's tensor in from, or for the run's end.
func (r *runner) input(from []chan *tensor.Tensor, a pipeline.Action) (*tensor.Tensor, error) {
	select {
	case t := <-from[a.Chunk*r.m+a.MB]:
		return t, nil
	case <-r.ctx.Done():
		return nil, context.Cause(r.ctx)
	}
}

// compute runs the stage's actions in order, queueing the sends.
func (r *runner) compute(start time.Time, tr *Trace) error {
	held := 0
	pending := map[pipeline.Action]sending{} // fused: gradients sent after their W (keyed by the W)
	for _, a := range r.order {
		if r.ctx.Err() != nil {
			return context.Cause(r.ctx)
		}
		u := pipeline.Virtual(r.p, r.s, a.Chunk)
		first, last, st := u == 0, u == r.p*r.v-1, r.chunks[a.Chunk]
		ready := time.Since(start)
		var in *tensor.Tensor
		var err error
		switch {
		case a.Op == 'F' && !first:
			in, err = r.input(r.acts, a)
		case a.Op == 'B' && !last:
			in, err = r.input(r.grads, a)
		}
		if err != nil {
			return err
		}
		begin := time.Since(start)
		var end time.Duration // when the action's work ended (before its send is queued)
		switch a.Op {
		case 'F':
			out, err := st.Forward(r.ctx, a.MB, in)
			end = time.Since(start)
			if err != nil {
				return fmt.Errorf("stage %d: %v: %w", r.s, a, err)
			}
			if !last {
				if err := r.check(out, a); err != nil {
					return err
				}
				r.next.out <- sending{out, a}
				runtime.Gosched() // the sender posts it now, not after the next action (one core: GOMAXPROCS=1)
			}
			held++
			tr.Peak = max(tr.Peak, held)
		case 'B':
			out, err := st.BackwardInput(r.ctx, a.MB, in)
			end = time.Since(start)
			if err != nil {
				return fmt.Errorf("stage %d: %v: %w", r.s, a, err)
			}
			if !first {
				if err := r.check(out, a); err != nil {
					return err
				}
				if r.fused {
					pending[pipeline.Action{Op: 'W', MB: a.MB, Chunk: a.Chunk}] = sending{out, a}
				} else {
					r.prev.out <- sending{out, a}
					runtime.Gosched()
				}
			}
		case 'W':
			err := st.BackwardWeight(r.ctx, a.MB)
			end = time.Since(start)
			if err != nil {
				return fmt.Errorf("stage %d: %v: %w", r.s, a, err)
			}
			if out, ok := pending[a]; ok {
				r.prev.out <- out
				runtime.Gosched()
				delete(pending, a)
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
	for i, e := range t.Events {
		t.Busy += e.End - e.Start
		t.Makespan = max(t.Makespan, e.End)
		if i > 0 {
			t.Overhead += e.Start - e.Wait - t.Events[i-1].End
		}
	}
	t.Idle = t.Makespan - t.Busy
	if t.Makespan > 0 {
		t.Bubble = float64(t.Idle) / float64(t.Makespan)
	}
}
