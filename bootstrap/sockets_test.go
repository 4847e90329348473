package bootstrap_test

// Simulated ranks of the control-plane tests: each joins over a NATS socket
// of its own that a test can cut, freeze or kill.

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/natsrv"
	"github.com/nats-io/nats.go"
)

// sockets keeps each simulated rank's NATS socket, to kill or stop a rank;
// late holds the ranks whose copy of the roster is to reach them late, and
// by how much.
type sockets struct {
	mu       sync.Mutex
	conns    map[int]*rankConn
	late     map[int]time.Duration
	dropOpen map[int]bool
}

func (s *sockets) conn(rank int) *rankConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns[rank]
}

// rankConn is a simulated rank's NATS socket. kill closes it with RST, what
// the kernel does to the socket of a killed process; freeze stops its reads
// and writes while it stays open, as SIGSTOP leaves the socket of a stopped
// process: nothing more is sent (the client's flusher, and with it every
// publish of that connection, waits in Write) and nothing more is read; cut
// makes it a link that drops everything while the rank runs on: writes
// vanish, reads never return. With late set, the read that brings the
// roster returns that much later (and so does all that follows it), as when
// the server is still sending N copies of the roster.
type rankConn struct {
	*net.TCPConn
	mu      sync.Mutex
	stopped chan struct{} // non-nil while frozen or cut; closed by kill
	cut     bool
	late    time.Duration // read by the client's read loop only
	// dropOpen: the first "rdv.open" delivered to the rank is cut out of
	// what it reads, as a cluster drops it when it reaches a server before
	// the rank's interest has
	dropOpen atomic.Bool
}

func (c *rankConn) Read(b []byte) (int, error) {
	c.mu.Lock()
	ch := c.stopped
	c.mu.Unlock()
	if ch != nil {
		<-ch
	}
	n, err := c.TCPConn.Read(b)
	if c.dropOpen.Load() {
		n = c.cutOpen(b, n)
	}
	if c.late > 0 && bytes.Contains(b[:n], []byte(".rdv.roster ")) {
		time.Sleep(c.late)
		c.late = 0
	}
	return n, err
}

// cutOpen removes the frame "MSG <prefix>.rdv.open <sid> <size>\r\n<payload>\r\n"
// from b[:n] if it is there whole, and returns the new length.
func (c *rankConn) cutOpen(b []byte, n int) int {
	i := bytes.Index(b[:n], []byte(".rdv.open "))
	if i < 0 {
		return n
	}
	start := bytes.LastIndex(b[:i], []byte("MSG "))
	eol := bytes.Index(b[i:n], []byte("\r\n"))
	if start < 0 || eol < 0 {
		return n
	}
	head := strings.Fields(string(b[start : i+eol]))
	size, err := strconv.Atoi(head[len(head)-1])
	end := i + eol + 2 + size + 2
	if err != nil || end > n {
		return n
	}
	c.dropOpen.Store(false)
	copy(b[start:], b[end:n])
	return n - (end - start)
}

func (c *rankConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	ch, cut := c.stopped, c.cut
	c.mu.Unlock()
	if cut {
		return len(b), nil
	}
	if ch != nil {
		<-ch
	}
	return c.TCPConn.Write(b)
}

func (c *rankConn) cutLink() {
	c.freeze()
	c.mu.Lock()
	c.cut = true
	c.mu.Unlock()
}

func (c *rankConn) freeze() {
	c.mu.Lock()
	if c.stopped == nil {
		c.stopped = make(chan struct{})
	}
	c.mu.Unlock()
}

// kill closes the socket abruptly; a frozen one's blocked reads and writes
// then fail.
func (c *rankConn) kill() {
	c.TCPConn.SetLinger(0)
	c.TCPConn.Close()
	c.mu.Lock()
	if c.stopped != nil {
		close(c.stopped)
		c.stopped = nil
	}
	c.cut = false
	c.mu.Unlock()
}

type rankDialer struct {
	s    *sockets
	rank int
}

func (d rankDialer) Dial(network, address string) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, 10*time.Second)
	if err != nil {
		return nil, err
	}
	rc := &rankConn{TCPConn: c.(*net.TCPConn)}
	d.s.mu.Lock()
	rc.late = d.s.late[d.rank]
	rc.dropOpen.Store(d.s.dropOpen[d.rank])
	d.s.conns[d.rank] = rc
	d.s.mu.Unlock()
	return rc, nil
}

// joinControl joins n control-only ranks (transport "none") with fast heartbeats.
func joinControl(t *testing.T, n int) ([]*collective.World, *sockets, *nats.Conn, string) {
	t.Helper()
	job := bootstraptest.NewJob()
	s := bootstraptest.StartServer(t, job)
	ws, sk := joinRanks(t, s, job, n, "none", collective.Options{}, time.Second)
	return ws, sk, bootstraptest.AdminConn(t, s), job
}

// joinRanks joins n ranks of job on s over transport with heartbeats every
// 100 ms, a rank lost after hbTimeout; they are closed when the test ends, a
// frozen rank's socket killed first.
func joinRanks(t *testing.T, s *natsrv.Server, job string, n int, transport string, o collective.Options, hbTimeout time.Duration) ([]*collective.World, *sockets) {
	t.Helper()
	sk := &sockets{conns: map[int]*rankConn{}}
	j := startJoins(t, s, job, n, transport, o, hbTimeout, sk)
	<-j.done
	for r, err := range j.errs {
		if err != nil {
			t.Fatalf("rank %d: join: %v", r, err)
		}
	}
	return j.ws, sk
}

// joins are ranks joining concurrently: each World (or error) is there once
// that rank's Join has returned; done is closed when all have.
type joins struct {
	mu   sync.Mutex
	ws   []*collective.World
	errs []error
	done chan struct{}
}

func (j *joins) world(r int) *collective.World {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.ws[r]
}

// startJoins starts the Joins of n ranks of job on s (see joinRanks), their
// sockets kept in sk; they are closed when the test ends.
func startJoins(t *testing.T, s *natsrv.Server, job string, n int, transport string, o collective.Options, hbTimeout time.Duration, sk *sockets) *joins {
	j := &joins{ws: make([]*collective.World, n), errs: make([]error, n), done: make(chan struct{})}
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		cfg := bootstraptest.Config(s, job, r, n, transport, o)
		cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 100*time.Millisecond, hbTimeout
		cfg.RendezvousTimeout = 30 * time.Second
		cfg.Dialer = rankDialer{sk, r}
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := bootstrap.Join(context.Background(), cfg)
			j.mu.Lock()
			j.ws[cfg.Rank], j.errs[cfg.Rank] = w, err
			j.mu.Unlock()
		}()
	}
	go func() { wg.Wait(); close(j.done) }()
	t.Cleanup(func() {
		<-j.done
		for _, w := range j.ws {
			if w != nil {
				w.Close()
			}
		}
	})
	t.Cleanup(func() { // before the worlds close: a frozen rank's Close would wait
		sk.mu.Lock()
		defer sk.mu.Unlock()
		for _, c := range sk.conns {
			c.mu.Lock()
			frozen := c.stopped != nil
			c.mu.Unlock()
			if frozen {
				c.kill()
			}
		}
	})
	return j
}

func waitAll(ws []*collective.World, skip int, within time.Duration) bool {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		all := true
		for r, w := range ws {
			if r != skip && w.Err() == nil {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}
