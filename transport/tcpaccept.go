package transport

import (
	"errors"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"
)

// The tcp data listener during setup. Anyone who can reach the port may
// connect, so no connection may hold up another: every accepted connection is
// handshaken in its own goroutine under its own deadline (tcpHandshakeTimeout),
// at most tcpMaxHandshakes at a time; when that many are pending, the oldest is
// closed to make room. A rank's dialer sends its hello as soon as it connects
// and completes in a round trip or two, so a crowd of silent connections can
// only delay it by making it dial again (tcpTransport.dial does). Connections
// that do not authenticate are closed and counted; the count goes to the log at
// most once per tcpDropLogEvery, and once more when the listener closes.

const (
	tcpMaxHandshakes = 64
	tcpDropLogEvery  = 10 * time.Second
)

type acceptor struct {
	t      *tcpTransport
	ln     net.Listener
	secret []byte
	log    *zap.Logger
	out    chan *tcpConn // authenticated connections, unbuffered
	done   chan struct{} // closed by stop
	wg     sync.WaitGroup

	mu      sync.Mutex
	stopped bool
	pending []*pendingConn // oldest first; finished ones linger until compacted
	live    int            // pending and not finished
	drops   dropCounter
}

type pendingConn struct {
	c    *net.TCPConn
	over bool   // finished, evicted or kept (a.mu)
	why  string // why we closed it, if we did
}

type dropCounter struct {
	n, total int // since the last log line, and in all
	lastLog  time.Time
	from     string // the last one's remote address and reason
	why      string
}

func startAcceptor(t *tcpTransport, ln net.Listener, secret []byte, log *zap.Logger) *acceptor {
	a := &acceptor{t: t, ln: ln, secret: secret, log: log.With(zap.String("listener", ln.Addr().String())),
		out: make(chan *tcpConn), done: make(chan struct{})}
	a.wg.Add(1)
	go a.run()
	return a
}

func (a *acceptor) run() {
	defer a.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := a.ln.Accept()
		if err != nil {
			select {
			case <-a.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, or a connection reset before it was
			// accepted: keep listening.
			select {
			case <-a.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			continue
		}
		p := a.admit(tc)
		if p == nil {
			tc.Close()
			return
		}
		a.wg.Add(1) // run holds a count: never concurrent with a Wait at zero
		go a.handshake(p)
	}
}

// admit registers c, evicting the oldest pending handshake if there are too
// many; nil once stopped.
func (a *acceptor) admit(c *net.TCPConn) *pendingConn {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return nil
	}
	for len(a.pending) > 0 && a.pending[0].over {
		a.pending = a.pending[1:]
	}
	if len(a.pending) > 4*tcpMaxHandshakes {
		kept := a.pending[:0]
		for _, p := range a.pending {
			if !p.over {
				kept = append(kept, p)
			}
		}
		clear(a.pending[len(kept):])
		a.pending = kept
	}
	if a.live >= tcpMaxHandshakes {
		for _, p := range a.pending {
			if !p.over {
				a.closeLocked(p, "evicted: too many connections pending")
				break
			}
		}
	}
	p := &pendingConn{c: c}
	a.pending = append(a.pending, p)
	a.live++
	return p
}

func (a *acceptor) closeLocked(p *pendingConn, why string) {
	p.over, p.why = true, why
	a.live--
	p.c.Close()
}

func (a *acceptor) handshake(p *pendingConn) {
	defer a.wg.Done()
	from := "?"
	if ra := p.c.RemoteAddr(); ra != nil {
		from = ra.String()
	}
	peer, err := a.t.acceptHandshake(p.c, a.secret, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		if p.over {
			return false
		}
		p.over = true // no longer evictable
		a.live--
		return true
	})
	if err == nil {
		select {
		case a.out <- &tcpConn{c: p.c, peer: peer}:
			return
		case <-a.done:
			err = errors.New("setup over")
		}
	}
	p.c.Close()
	a.mu.Lock()
	if !p.over {
		p.over = true
		a.live--
	}
	why := p.why
	if why == "" {
		why = err.Error()
	}
	a.dropLocked(from, why)
	a.mu.Unlock()
}

// dropLocked counts a connection that did not authenticate and logs the count,
// at most once per tcpDropLogEvery.
func (a *acceptor) dropLocked(from, why string) {
	d := &a.drops
	d.n++
	d.total++
	d.from, d.why = from, why
	if now := time.Now(); now.Sub(d.lastLog) >= tcpDropLogEvery {
		d.lastLog = now
		a.logDrops()
	}
}

func (a *acceptor) logDrops() {
	d := &a.drops
	if d.n == 0 {
		return
	}
	a.log.Warn("tcp data listener closed connections that did not authenticate as a rank of this job",
		zap.Int("closed", d.n), zap.Int("closed_in_all", d.total), zap.String("last_from", d.from), zap.String("last_reason", d.why))
	d.n = 0
}

// stop closes the listener and every pending handshake, waits for their
// goroutines and logs what it dropped since the last line.
func (a *acceptor) stop() {
	a.mu.Lock()
	a.stopped = true
	for _, p := range a.pending {
		if !p.over {
			a.closeLocked(p, "setup over")
		}
	}
	a.pending = nil
	a.mu.Unlock()
	close(a.done)
	a.ln.Close()
	a.wg.Wait()
	a.mu.Lock()
	a.logDrops()
	a.mu.Unlock()
}
