package collective

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/meshrun/meshrun/protocol"
)

// State is what a rank is doing, as its heartbeats report it (the wire type
// is protocol's).
type State = protocol.State

// Notice tells every rank of a group (or the whole job) that a collective
// failed (the wire type is protocol's).
type Notice = protocol.Notice

var codes = map[error]string{
	ErrAborted: protocol.CodeAborted, ErrPeerLost: protocol.CodePeerLost, ErrMismatch: protocol.CodeMismatch,
	ErrTimeout: protocol.CodeTimeout, ErrControlLost: protocol.CodeControlLost, ErrCorrupt: protocol.CodeCorrupt,
	ErrAuth: protocol.CodeAuth, ErrClosed: protocol.CodeClosed, ErrLibrary: protocol.CodeLibrary,
}

func kindOf(code string) error {
	for k, v := range codes {
		if v == code {
			return k
		}
	}
	return ErrAborted
}

func noticeOf(e *Error) Notice {
	return Notice{Group: e.Group, Seq: e.Seq, Op: e.Op, Code: codes[e.Kind], Rank: e.Rank, Reporter: e.Reporter, Want: e.Want, Got: e.Got, Detail: e.Detail, Decided: true}
}

// noticeErr is the error a notice tells of.
func noticeErr(n Notice) *Error {
	k := kindOf(n.Code)
	if n.Abort {
		k = ErrAborted
	}
	return &Error{Kind: k, Rank: n.Rank, Reporter: n.Reporter, Group: n.Group, Seq: n.Seq, Op: n.Op, Want: n.Want, Got: n.Got, Detail: n.Detail}
}

// Control is the coordination plane a World uses: failure notices to the group,
// and what every rank is doing (heartbeats). The NATS implementation is the
// real one; LocalControls serves in-process tests.
type Control interface {
	// Publish sends a notice to every rank of the job (including this one).
	Publish(n Notice) error
	// Attach registers this rank's state source (read for every heartbeat) and
	// the handler of notices; called once by the World.
	Attach(state func() State, notice func(Notice))
	// PeerState returns the last state heard from rank and when it was heard.
	PeerState(rank int) (State, time.Time, bool)
	// Offer makes value the answer to the job's ranks that Ask for name, until
	// Close. A name is offered once.
	Offer(name string, value []byte) error
	// Ask waits for the value offered under name, until ctx is done.
	Ask(ctx context.Context, name string) ([]byte, error)
	Close() error
}

// LocalControls returns n in-process controls sharing one notice bus; a peer's
// state is read live.
func LocalControls(n int) []Control {
	h := &localHub{states: make([]func() State, n), subs: make([]func(Notice), n), offered: map[string][]byte{}, changed: make(chan struct{})}
	out := make([]Control, n)
	for i := range out {
		out[i] = &localControl{h: h, rank: i}
	}
	return out
}

type localHub struct {
	mu      sync.Mutex
	states  []func() State
	subs    []func(Notice)
	offered map[string][]byte
	changed chan struct{} // closed and replaced at every Offer
}

type localControl struct {
	h    *localHub
	rank int
}

func (c *localControl) Publish(n Notice) error {
	c.h.mu.Lock()
	subs := slices.Clone(c.h.subs)
	c.h.mu.Unlock()
	for _, fn := range subs {
		if fn != nil {
			go fn(n) // as a network would: asynchronously
		}
	}
	return nil
}

func (c *localControl) Attach(state func() State, notice func(Notice)) {
	c.h.mu.Lock()
	c.h.states[c.rank] = state
	c.h.subs[c.rank] = notice
	c.h.mu.Unlock()
}

func (c *localControl) PeerState(rank int) (State, time.Time, bool) {
	c.h.mu.Lock()
	fn := c.h.states[rank]
	c.h.mu.Unlock()
	if fn == nil {
		return State{}, time.Time{}, false
	}
	return fn(), time.Now(), true
}

func (c *localControl) Offer(name string, value []byte) error {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	if _, ok := c.h.offered[name]; ok {
		return fmt.Errorf("%w: %q offered twice", ErrInvalid, name)
	}
	c.h.offered[name] = slices.Clone(value)
	close(c.h.changed)
	c.h.changed = make(chan struct{})
	return nil
}

func (c *localControl) Ask(ctx context.Context, name string) ([]byte, error) {
	for {
		c.h.mu.Lock()
		v, ok := c.h.offered[name]
		ch := c.h.changed
		c.h.mu.Unlock()
		if ok {
			return slices.Clone(v), nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("asking for %q: %w", name, context.Cause(ctx))
		}
	}
}

func (c *localControl) Close() error {
	c.h.mu.Lock()
	c.h.subs[c.rank] = nil
	c.h.states[c.rank] = nil
	c.h.mu.Unlock()
	return nil
}
