package collective

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Transport is the data plane of one rank: ordered, reliable messages to and
// from every other rank of the world. Algorithms are written once over it.
//
// Send and Recv may run concurrently with each other and across peers, but at
// most one Send and one Recv per peer at a time (the Group guarantees
// it). Every message carries a Header; Recv checks it against the header the
// caller expects (see CheckHeader) before a byte of payload is used, and fails
// with ErrMismatch, ErrPeerLost, ErrTimeout (past the Deadline) or the error
// given to Abort.
//
// Every Send and Recv is bounded by a Deadline, which a transport must honour
// by itself: its Done channel is not closed when its time passes (see
// Deadline), so a wait that watches Done alone never ends on a peer that
// vanished without a word. Each wait site arms a WaitTimer for the deadline
// next to Done and the transport's own abort, and ends with Deadline.Err.
type Transport interface {
	// Name is "local", "shm", "tcp" or "nats".
	Name() string
	Rank() int
	Size() int
	// MaxChunk is the largest payload of one message, in bytes.
	MaxChunk() int
	// Send delivers h and payload to peer; h.Length is set by the caller. It
	// returns once payload may be reused, or fails once dl ends.
	Send(dl Deadline, peer int, h *Header, payload []byte) error
	// Recv receives the next message from peer into dst, which has exactly
	// want.Length bytes, or fails once dl ends.
	Recv(dl Deadline, peer int, want *Header, dst []byte) error
	// Abort fails every pending and future Send and Recv on the links to peers
	// with err. The links are unusable afterwards.
	Abort(peers []int, err error)
	// Close releases the transport; pending calls fail.
	Close() error
}

// Deadline bounds one Send or Recv: the collective's deadline, and a channel
// closed when the call must end early (the World failed or closed).
//
// Done is not closed when At passes: a collective makes many calls, and a
// channel closed at a time would cost a timer and an allocation per
// collective. A transport that waits watches Done, its own abort and a timer
// for At (WaitTimer: no allocation once made), and ends the wait with Err,
// which names the cause.
type Deadline struct {
	// At is when the call fails with ErrTimeout; the zero time means never.
	At time.Time
	// Done is closed when the call must end before At; nil means never.
	Done <-chan struct{}
	// cause says why Done was closed (the World's context).
	cause context.Context
}

// DeadlineOf returns the Deadline of a call bounded by ctx: its deadline, its
// Done channel, and its cause for Err.
func DeadlineOf(ctx context.Context) Deadline {
	at, _ := ctx.Deadline()
	return Deadline{At: at, Done: ctx.Done(), cause: ctx}
}

// Expired reports whether the call must end now: Done is closed or At has
// passed. A transport that polls (shm) asks it between waits.
func (d Deadline) Expired() bool {
	select {
	case <-d.Done:
		return true
	default:
	}
	return !d.At.IsZero() && !time.Now().Before(d.At)
}

// Err is the typed error of a call to or from peer that ended at d, what
// saying what it was doing ("sending"): the cause of Done when it is an error
// of its own (the World's failure), ErrTimeout naming peer once At has passed,
// else ErrAborted.
func (d Deadline) Err(peer int, what string) error {
	var err error
	if d.cause != nil {
		if cause := context.Cause(d.cause); cause != nil && cause != context.Canceled && cause != context.DeadlineExceeded {
			return cause
		}
		err = d.cause.Err()
	} else {
		select {
		case <-d.Done:
			err = context.Canceled
		default:
		}
	}
	if err == nil && !d.At.IsZero() && !time.Now().Before(d.At) {
		err = context.DeadlineExceeded
	}
	if err == context.DeadlineExceeded {
		return &Error{Kind: ErrTimeout, Rank: peer, Reporter: -1, Detail: what}
	}
	return &Error{Kind: ErrAborted, Rank: -1, Reporter: -1, Detail: what + ": " + fmt.Sprint(err)}
}

// WaitTimer is a reusable deadline timer for one waiter (one per link and
// direction), so that waiting allocates nothing after the first wait.
type WaitTimer struct{ t *time.Timer }

// Until returns a channel that receives at d.At (nil, which never receives,
// when d has no deadline). Stop the timer once the wait ends.
func (w *WaitTimer) Until(d Deadline) <-chan time.Time {
	if d.At.IsZero() {
		return nil
	}
	dur := time.Until(d.At)
	if w.t == nil {
		w.t = time.NewTimer(dur)
	} else {
		w.t.Reset(dur)
	}
	return w.t.C
}

// Stop stops the timer armed by Until.
func (w *WaitTimer) Stop() {
	if w.t != nil {
		w.t.Stop()
	}
}

// ---- local transport: in-process, for tests ----

type localMsg struct {
	h    Header
	data []byte
}

type localLink struct {
	ch    chan localMsg
	st    WaitTimer // the sender's
	rt    WaitTimer // the receiver's
	once  sync.Once
	abort chan struct{}
	err   error
}

func (l *localLink) fail(err error) {
	l.once.Do(func() { l.err = err; close(l.abort) })
}

type localFabric struct {
	n     int
	links [][]*localLink // links[src][dst]
	dead  []chan struct{}
	once  []sync.Once
}

// LocalTransports returns n connected in-process transports, one per rank.
// Messages are copied, so a sender never waits for its receiver.
func LocalTransports(n int) []Transport {
	f := &localFabric{n: n, links: make([][]*localLink, n), dead: make([]chan struct{}, n), once: make([]sync.Once, n)}
	for i := range f.links {
		f.dead[i] = make(chan struct{})
		f.links[i] = make([]*localLink, n)
		for j := range f.links[i] {
			f.links[i][j] = &localLink{ch: make(chan localMsg, 4096), abort: make(chan struct{})}
		}
	}
	out := make([]Transport, n)
	for i := range out {
		out[i] = &localTransport{f: f, rank: i}
	}
	return out
}

type localTransport struct {
	f    *localFabric
	rank int
}

func (t *localTransport) Name() string  { return "local" }
func (t *localTransport) Rank() int     { return t.rank }
func (t *localTransport) Size() int     { return t.f.n }
func (t *localTransport) MaxChunk() int { return 1 << 20 }

func (t *localTransport) Send(dl Deadline, peer int, h *Header, p []byte) error {
	l := t.f.links[t.rank][peer]
	select {
	case <-l.abort:
		return l.err
	case <-t.f.dead[peer]:
		return &Error{Kind: ErrPeerLost, Rank: peer, Reporter: t.rank, Detail: "peer closed its transport"}
	default:
	}
	m := localMsg{h: *h, data: append([]byte(nil), p...)}
	m.h.Length = uint32(len(p))
	select {
	case l.ch <- m:
		return nil
	default:
	}
	defer l.st.Stop()
	select {
	case l.ch <- m:
		return nil
	case <-l.abort:
		return l.err
	case <-t.f.dead[peer]:
		return &Error{Kind: ErrPeerLost, Rank: peer, Reporter: t.rank, Detail: "peer closed its transport"}
	case <-dl.Done:
		return dl.Err(peer, "sending")
	case <-l.st.Until(dl):
		return dl.Err(peer, "sending")
	}
}

func (t *localTransport) Recv(dl Deadline, peer int, want *Header, dst []byte) error {
	l := t.f.links[peer][t.rank]
	in := t.f.links[t.rank][peer] // aborts are recorded on our outgoing side too
	var m localMsg
	select {
	case m = <-l.ch:
	default:
		defer l.rt.Stop()
		select {
		case m = <-l.ch:
		case <-l.rt.Until(dl):
			return dl.Err(peer, "receiving")
		case <-l.abort:
			return l.err
		case <-in.abort:
			return in.err
		case <-t.f.dead[peer]:
			select {
			case m = <-l.ch:
			default:
				return &Error{Kind: ErrPeerLost, Rank: peer, Reporter: t.rank, Detail: "peer closed its transport"}
			}
		case <-dl.Done:
			return dl.Err(peer, "receiving")
		}
	}
	// The local transport round-trips the header through the wire encoding so
	// that the codec is exercised by every test.
	var buf [HeaderSize]byte
	m.h.Encode(buf[:])
	got, err := DecodeHeader(buf[:], MaxPayload)
	if err != nil {
		return err
	}
	if err := CheckHeader(want, &got); err != nil {
		return err
	}
	copy(dst, m.data)
	return nil
}

func (t *localTransport) Abort(peers []int, err error) {
	for _, p := range peers {
		if p == t.rank {
			continue
		}
		t.f.links[t.rank][p].fail(err)
		t.f.links[p][t.rank].fail(err)
	}
}

// Close marks the rank dead: its peers' pending calls fail with ErrPeerLost.
func (t *localTransport) Close() error {
	t.f.once[t.rank].Do(func() { close(t.f.dead[t.rank]) })
	return nil
}
