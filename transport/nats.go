package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/protocol"
)

// The nats transport: the fallback data path where ranks cannot reach each
// other directly. Each message (header + payload) is one NATS message on
// meshrun.<job>.data.<dst>.<src>, at most the server's max_payload. A sender
// holds at most natsWindow unacknowledged messages per destination; the
// receiver returns credits on meshrun.<job>.credit.<src>.<dst> as it consumes,
// so no subscription ever buffers more than the window and the server never
// flags a slow consumer. A peer's death shows as silence: the heartbeat monitor
// (or the collective's deadline) fails the World.

const natsWindow = 16

// NATS is what the nats data path needs of the rank's NATS connection;
// package bootstrap gives its *nats.Conn through an adapter, so that this
// package does not depend on the client library.
type NATS interface {
	// MaxPayload is the largest message the server takes, in bytes.
	MaxPayload() int64
	Publish(subject string, data []byte) error
	// Subscribe calls f with every message on subject (reply is the
	// subject to answer on, if any), one at a time, in order.
	Subscribe(subject string, f func(subject, reply string, data []byte)) (Subscription, error)
	// ChanSubscribe delivers the data of every message on subject to ch,
	// without blocking: the client holds at most pending messages of at
	// most pendingBytes in all, beyond which it drops them as a slow
	// consumer's.
	ChanSubscribe(subject string, ch chan []byte, pending, pendingBytes int) (Subscription, error)
	// Flush returns once the server has processed everything sent so far.
	Flush() error
	// Request sends an empty request on subject and waits for an answer
	// until ctx ends; ErrNoResponders when nobody subscribes to subject.
	Request(ctx context.Context, subject string) error
}

// Subscription is one subscription of a NATS connection.
type Subscription interface {
	Unsubscribe() error
}

// ErrNoResponders is NATS.Request's error when nobody listens on the subject.
var ErrNoResponders = errors.New("transport: no responders")

type natsLink struct {
	in      chan []byte
	sub     Subscription
	credits int
	cmu     sync.Mutex
	cch     chan struct{} // signaled when credits arrive
	consume int           // messages consumed since the last credit grant
	buf     []byte        // send buffer (header + payload)
	abort   chan struct{}
	st, rt  collective.WaitTimer
	once    sync.Once
	err     error
}

type natsTransport struct {
	nc         NATS
	job        string
	rank, size int
	max        int
	links      []*natsLink
	subs       []Subscription
	closeOnce  sync.Once
}

// NewNatsTransport sets up the nats data path for rank and waits until every
// peer's subscriptions are in place.
func NewNatsTransport(ctx context.Context, nc NATS, job string, rank, size int) (collective.Transport, error) {
	t := &natsTransport{nc: nc, job: job, rank: rank, size: size, links: make([]*natsLink, size)}
	t.max = int(nc.MaxPayload()) - collective.HeaderSize
	if t.max > collective.MaxPayload {
		t.max = collective.MaxPayload
	}
	if t.max < 1024 {
		return nil, fmt.Errorf("%w: NATS max_payload %d too small", collective.ErrInvalid, nc.MaxPayload())
	}
	fail := func(err error) (collective.Transport, error) {
		t.Close()
		return nil, &collective.Error{Kind: collective.ErrControlLost, Rank: -1, Reporter: rank, Detail: "nats data path: " + err.Error()}
	}
	for p := 0; p < size; p++ {
		if p == rank {
			continue
		}
		l := &natsLink{in: make(chan []byte, natsWindow+4), credits: natsWindow, cch: make(chan struct{}, 1), abort: make(chan struct{})}
		t.links[p] = l
		sub, err := nc.ChanSubscribe(protocol.DataSubject(job, rank, p), l.in, natsWindow+4, (natsWindow+4)*(t.max+collective.HeaderSize))
		if err != nil {
			return fail(err)
		}
		l.sub = sub
	}
	csub, err := nc.Subscribe(protocol.CreditSubjects(job, rank), func(subject, _ string, data []byte) {
		p, ok := protocol.ParseCreditSubject(job, rank, subject)
		if !ok || p < 0 || p >= size || t.links[p] == nil || len(data) != 4 {
			return
		}
		l := t.links[p]
		l.cmu.Lock()
		l.credits += int(binary.LittleEndian.Uint32(data))
		l.cmu.Unlock()
		select {
		case l.cch <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return fail(err)
	}
	t.subs = append(t.subs, csub)
	psub, err := nc.Subscribe(protocol.DataPingSubject(job, rank), func(_, reply string, _ []byte) {
		if reply != "" {
			nc.Publish(reply, nil)
		}
	})
	if err != nil {
		return fail(err)
	}
	t.subs = append(t.subs, psub)
	if err := nc.Flush(); err != nil {
		return fail(err)
	}
	// Wait until every peer answers its ping: its data subscriptions exist.
	for p := 0; p < size; p++ {
		if p == rank {
			continue
		}
		for {
			err := nc.Request(ctx, protocol.DataPingSubject(job, p))
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Close()
				return nil, &collective.Error{Kind: collective.ErrPeerLost, Rank: p, Reporter: rank, Detail: "nats data path: peer never ready"}
			}
			if errors.Is(err, ErrNoResponders) {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	return t, nil
}

func (t *natsTransport) Name() string  { return "nats" }
func (t *natsTransport) Rank() int     { return t.rank }
func (t *natsTransport) Size() int     { return t.size }
func (t *natsTransport) MaxChunk() int { return t.max }

func (t *natsTransport) Send(dl collective.Deadline, peer int, h *collective.Header, p []byte) error {
	l := t.links[peer]
	for {
		l.cmu.Lock()
		if l.credits > 0 {
			l.credits--
			l.cmu.Unlock()
			break
		}
		l.cmu.Unlock()
		select {
		case <-l.cch:
		case <-l.abort:
			return l.err
		case <-dl.Done:
			return dl.Err(peer, "sending (waiting for the receiver's window)")
		case <-l.st.Until(dl):
			l.st.Stop()
			return dl.Err(peer, "sending (waiting for the receiver's window)")
		}
		l.st.Stop()
	}
	select {
	case <-l.abort:
		return l.err
	default:
	}
	n := collective.HeaderSize + len(p)
	if cap(l.buf) < n {
		l.buf = make([]byte, n)
	}
	b := l.buf[:n]
	h.Length = uint32(len(p))
	h.Encode(b)
	copy(b[collective.HeaderSize:], p)
	if err := t.nc.Publish(protocol.DataSubject(t.job, peer, t.rank), b); err != nil {
		return &collective.Error{Kind: collective.ErrControlLost, Rank: -1, Reporter: t.rank, Detail: "nats data path: " + err.Error()}
	}
	return nil
}

func (t *natsTransport) Recv(dl collective.Deadline, peer int, want *collective.Header, dst []byte) error {
	l := t.links[peer]
	var m []byte
	select {
	case m = <-l.in:
	default:
		select {
		case m = <-l.in:
		case <-l.abort:
			return l.err
		case <-dl.Done:
			return dl.Err(peer, "receiving")
		case <-l.rt.Until(dl):
			l.rt.Stop()
			return dl.Err(peer, "receiving")
		}
		l.rt.Stop()
	}
	got, payload, err := collective.DecodeMessage(m, t.max)
	if err != nil {
		return err
	}
	if err := collective.CheckHeader(want, &got); err != nil {
		return err
	}
	copy(dst, payload)
	l.consume++
	if l.consume >= natsWindow/2 {
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], uint32(l.consume))
		l.consume = 0
		if err := t.nc.Publish(protocol.CreditSubject(t.job, peer, t.rank), b[:]); err != nil {
			return &collective.Error{Kind: collective.ErrControlLost, Rank: -1, Reporter: t.rank, Detail: "nats data path: " + err.Error()}
		}
	}
	return nil
}

func (t *natsTransport) Abort(peers []int, err error) {
	for _, p := range peers {
		if p >= 0 && p < t.size && t.links[p] != nil {
			l := t.links[p]
			l.once.Do(func() { l.err = err; close(l.abort) })
		}
	}
}

func (t *natsTransport) Close() error {
	t.closeOnce.Do(func() {
		all := make([]int, 0, t.size)
		for p := range t.links {
			all = append(all, p)
			if l := t.links[p]; l != nil && l.sub != nil {
				l.sub.Unsubscribe()
			}
		}
		for _, s := range t.subs {
			s.Unsubscribe()
		}
		t.Abort(all, errClosedTransport)
	})
	return nil
}
