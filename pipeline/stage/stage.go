// Package stage runs one stage of a pipeline schedule: the stage's order of
// forwards and backwards (package pipeline decides it) executed on a model
// part, with the activations and gradients passed to the neighbouring stages
// by point-to-point sends on the pp group (collective.Send and Recv).
//
// Run computes on the calling goroutine, in the schedule's order. A goroutine
// per neighbour direction sends what the stage produced, in order, so a send
// never holds the compute back; one goroutine receives what the stage will
// need, in the order it will need it, ahead of the compute. Run measures what
// ran: each action's start and end, the stage's busy and idle time, its
// bubble and the peak number of micro-batches it held (Trace).
// docs/pipeline.md has the whole of it.
package stage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/pipeline"
	"github.com/meshrun/meshrun/tensor"
)

// ErrInvalid is wrapped by Run's refusals of its arguments and of what the
// Stage returns: a group that does not fit the schedule, a missing shape, an
// activation or gradient of the wrong shape or dtype.
var ErrInvalid = errors.New("stage: invalid")

// Stage is one pipeline stage's model part, computing on host float32
// tensors. Run calls its methods from one goroutine, in the schedule's order.
type Stage interface {
	// Forward runs micro-batch mb: in is the previous stage's activation (nil
	// on the first stage); it returns the activation for the next stage
	// (ignored on the last).
	Forward(ctx context.Context, mb int, in *tensor.Tensor) (*tensor.Tensor, error)
	// BackwardInput runs mb's input-gradient backward: dout is the next
	// stage's gradient (nil on the last stage: its loss); it returns the
	// gradient for the previous stage (ignored on the first).
	BackwardInput(ctx context.Context, mb int, dout *tensor.Tensor) (*tensor.Tensor, error)
	// BackwardWeight runs mb's parameter-gradient backward (accumulating over
	// micro-batches).
	BackwardWeight(ctx context.Context, mb int) error
}

// Event is one action as it ran: Start and End are durations from Run's
// start; Wait is how long the stage waited for the action's input (the
// activation before an F, the gradient before a B) before Start.
type Event struct {
	pipeline.Action
	Start, End, Wait time.Duration
}

// Trace is what Run measured on its stage.
type Trace struct {
	// Stage is the stage's index (its index in the group), Kind the schedule.
	Stage int
	Kind  pipeline.Kind
	// Events are the actions in the order they ran: the schedule's.
	Events []Event
	// Makespan is from Run's start to the end of the stage's last action;
	// Total to Run's return (the last sends drained).
	Makespan, Total time.Duration
	// Busy is the sum of the actions' durations, Idle the makespan less it
	// (the waits at the start and the end included), Bubble Idle / Makespan.
	Busy, Idle time.Duration
	Bubble     float64
	// Overhead is the part of Idle the stage spent on its own between
	// actions: from an action's end to when the next was ready to wait for
	// its input or start (queueing a send, giving an input back, the
	// trace), not waiting for a neighbour.
	Overhead time.Duration
	// Peak is the most micro-batches whose activations the stage held at
	// once: each from the end of its F to the end of its W.
	Peak int
	// Sent and Received count the messages to and from the neighbours;
	// Sends are the sends as they ran, in the order they began.
	Sent, Received int
	Sends          []Send
}

// Send is one send to a neighbour as it ran: the action whose result it
// carried (an F's activation to stage s+1, a B's gradient to s−1), the
// stage it went to, and when it began and ended, from Run's start (a send
// ends when the transport took it: on a transport that holds a send until
// it is received, when the neighbour received it).
type Send struct {
	pipeline.Action
	To         int
	Start, End time.Duration
}

// Actions is the order the events ran in.
func (t Trace) Actions() []pipeline.Action {
	a := make([]pipeline.Action, len(t.Events))
	for i, e := range t.Events {
		a[i] = e.Action
	}
	return a
}

// String is one line: the stage, its step, busy, idle, bubble and peak.
func (t Trace) String() string {
	return fmt.Sprintf("stage %d (%v): %d actions, step %v, busy %v, idle %v, bubble %.1f%%, peak activations %d",
		t.Stage, t.Kind, len(t.Events), t.Makespan, t.Busy, t.Idle, 100*t.Bubble, t.Peak)
}

// validate checks the schedule, the group, the chunks and the shapes
// before anything runs. The orders of sends and receives need no check of
// their own: each neighbour's messages are received in the order it sends
// them (takesFrom), into the slot of the action that takes each.
func validate(g *collective.Group, sched [][]pipeline.Action, chunks []Stage, shape func(int) []int) error {
	p := len(sched)
	switch {
	case g == nil || len(chunks) == 0 || slices.Contains(chunks, nil) || shape == nil:
		return fmt.Errorf("%w: a nil group, stage or shape", ErrInvalid)
	case p == 0 || len(sched[0])%(3*len(chunks)) != 0:
		return fmt.Errorf("%w: a schedule of %d stages for %d chunks a stage", ErrInvalid, p, len(chunks))
	case g.Size() != p:
		return fmt.Errorf("%w: a group of %d for %d stages", ErrInvalid, g.Size(), p)
	case pipeline.Chunks(sched) != len(chunks):
		return fmt.Errorf("%w: a schedule of %d chunks a stage for %d", ErrInvalid, pipeline.Chunks(sched), len(chunks))
	}
	for _, c := range chunks[1:] {
		if !wireOf(c).same(wireOf(chunks[0])) {
			return fmt.Errorf("%w: chunks on the wires %v and %v", ErrInvalid, wireOf(chunks[0]), wireOf(c))
		}
	}
	v := len(chunks)
	m := len(sched[0]) / (3 * v)
	if err := pipeline.Check(sched, p, m); err != nil {
		return err
	}
	for mb := 0; mb < m; mb++ {
		if sh := shape(mb); len(sh) == 0 || slices.ContainsFunc(sh, func(d int) bool { return d < 0 }) {
			return fmt.Errorf("%w: micro-batch %d: shape %v", ErrInvalid, mb, sh)
		}
	}
	return nil
}

// Costs is what the stage's actions took, as the model prices them, in
// milliseconds: the median F, B and W, and the median time from the end of
// the action a send carries (a fused backward's W) to the send's end (the
// activation or gradient queued, posted and taken by the transport), the
// model's Send; 0 where the trace has none. pipeline.Simulate under these
// costs is what the schedule would give were every action its median: the
// measured bubble less that is the noise (actions slower than their
// median, a send waiting for a core).
func (t Trace) Costs() (c pipeline.StageCost, send float64) {
	var d [3][]time.Duration
	ends := map[pipeline.Action]time.Duration{}
	for _, e := range t.Events {
		if k := strings.IndexByte("FBW", e.Op); k >= 0 {
			d[k] = append(d[k], e.End-e.Start)
		}
		ends[e.Action] = e.End
	}
	var sends []time.Duration
	for _, x := range t.Sends {
		from := x.Action
		if from.Op == 'B' && t.Kind.Fused() {
			from.Op = 'W' // a fused backward's gradient leaves after its W
		}
		if end, ok := ends[from]; ok {
			sends = append(sends, x.End-end)
		}
	}
	ms := func(v []time.Duration) float64 { return float64(medianDuration(v)) / float64(time.Millisecond) }
	return pipeline.StageCost{F: ms(d[0]), B: ms(d[1]), W: ms(d[2])}, ms(sends)
}

// medianDuration is v's median (the mean of the middle two of an even
// count); 0 for none.
func medianDuration(v []time.Duration) time.Duration {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
