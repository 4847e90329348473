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
// caller expects (see checkHeader) before a byte of payload is used, and fails
// with ErrMismatch, ErrPeerLost, ErrTimeout (ctx deadline) or the error given to
// Abort.
type Transport interface {
	// Name is "local", "shm", "tcp" or "nats".
	Name() string
	Rank() int
	Size() int
	// MaxChunk is the largest payload of one message, in bytes.
	MaxChunk() int
	// Send delivers h and payload to peer; h.Length is set by the caller. It
	// returns once payload may be reused.
	Send(ctx context.Context, peer int, h *Header, payload []byte) error
	// Recv receives the next message from peer into dst, which has exactly
	// want.Length bytes.
	Recv(ctx context.Context, peer int, want *Header, dst []byte) error
	// Abort fails every pending and future Send and Recv on the links to peers
	// with err. The links are unusable afterwards.
	Abort(peers []int, err error)
	// Close releases the transport; pending calls fail.
	Close() error
}

// ctxErr converts a context error into a typed one.
func ctxErr(ctx context.Context, peer int, what string) error {
	if cause := context.Cause(ctx); cause != nil && cause != context.Canceled && cause != context.DeadlineExceeded {
		return cause
	}
	if ctx.Err() == context.DeadlineExceeded {
		return &Error{Kind: ErrTimeout, Rank: peer, Reporter: -1, Detail: what}
	}
	return &Error{Kind: ErrAborted, Rank: -1, Reporter: -1, Detail: what + ": " + fmt.Sprint(ctx.Err())}
}

// waitTimer is a reusable deadline timer for one waiter (one per link and
// direction), so waiting allocates nothing.
type waitTimer struct{ t *time.Timer }

func (w *waitTimer) until(ctx context.Context) <-chan time.Time {
	dl, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	d := time.Until(dl)
	if w.t == nil {
		w.t = time.NewTimer(d)
	} else {
		w.t.Reset(d)
	}
	return w.t.C
}

func (w *waitTimer) stop() {
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
	st    waitTimer // the sender's
	rt    waitTimer // the receiver's
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

func (t *localTransport) Send(ctx context.Context, peer int, h *Header, p []byte) error {
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
	defer l.st.stop()
	select {
	case l.ch <- m:
		return nil
	case <-l.abort:
		return l.err
	case <-t.f.dead[peer]:
		return &Error{Kind: ErrPeerLost, Rank: peer, Reporter: t.rank, Detail: "peer closed its transport"}
	case <-ctx.Done():
		return ctxErr(ctx, peer, "sending")
	case <-l.st.until(ctx):
		return ctxErr(ctx, peer, "sending")
	}
}

func (t *localTransport) Recv(ctx context.Context, peer int, want *Header, dst []byte) error {
	l := t.f.links[peer][t.rank]
	in := t.f.links[t.rank][peer] // aborts are recorded on our outgoing side too
	var m localMsg
	select {
	case m = <-l.ch:
	default:
		defer l.rt.stop()
		select {
		case m = <-l.ch:
		case <-l.rt.until(ctx):
			return ctxErr(ctx, peer, "receiving")
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
		case <-ctx.Done():
			return ctxErr(ctx, peer, "receiving")
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
	if err := checkHeader(want, &got); err != nil {
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
