package collective_test

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/protocol"
	"github.com/nats-io/nats.go"
)

// sockets keeps each simulated rank's NATS socket, to kill a rank abruptly.
type sockets struct {
	mu    sync.Mutex
	conns map[int]net.Conn
}

type rankDialer struct {
	s    *sockets
	rank int
}

func (d rankDialer) Dial(network, address string) (net.Conn, error) {
	c, err := net.DialTimeout(network, address, 10*time.Second)
	if err == nil {
		d.s.mu.Lock()
		d.s.conns[d.rank] = c
		d.s.mu.Unlock()
	}
	return c, err
}

// joinControl joins n control-only ranks (transport "none") with fast heartbeats.
func joinControl(t *testing.T, n int) ([]*collective.World, *sockets, *nats.Conn, string) {
	t.Helper()
	job := newJob()
	s := startServer(t, job)
	sk := &sockets{conns: map[int]net.Conn{}}
	cfgs := make([]collective.Config, n)
	for r := range cfgs {
		cfgs[r] = config(s, job, r, n, "none", collective.Options{})
		cfgs[r].HeartbeatInterval, cfgs[r].HeartbeatTimeout = 100*time.Millisecond, time.Second
		cfgs[r].Dialer = rankDialer{sk, r}
	}
	ws, errs := joinAll(cfgs)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: join: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, w := range ws {
			w.Close()
		}
	})
	nc := adminConn(t, s)
	return ws, sk, nc, job
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

// TestControlPlane256: the control plane's faults at 256 ranks in one process
// (each rank watches one peer): a rank killed is named by every other rank
// within the heartbeat timeout + 2 s, an abort reaches every rank, and ranks
// closing in any order hand their watched ranks on without a false loss.
func TestControlPlane256(t *testing.T) {
	if testing.Short() {
		t.Skip("256 NATS connections")
	}
	const n = 256
	t.Run("kill", func(t *testing.T) {
		ws, sk, _, _ := joinControl(t, n)
		time.Sleep(300 * time.Millisecond)
		const victim = 97
		sk.mu.Lock()
		c := sk.conns[victim]
		sk.mu.Unlock()
		start := time.Now()
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
		if !waitAll(ws, victim, 3*time.Second) {
			t.Fatalf("not every rank failed within 3 s (heartbeat timeout 1 s)")
		}
		t.Logf("every rank failed %v after the kill", time.Since(start).Round(time.Millisecond))
		for r, w := range ws {
			var e *collective.Error
			if r != victim && (!errors.Is(w.Err(), collective.ErrPeerLost) || !errors.As(w.Err(), &e) || e.Rank != victim) {
				t.Fatalf("rank %d: %v, want ErrPeerLost naming rank %d", r, w.Err(), victim)
			}
		}
	})
	t.Run("abort", func(t *testing.T) {
		ws, _, nc, job := joinControl(t, n)
		body, _ := json.Marshal(protocol.AbortNotice("test"))
		nc.Publish(protocol.AbortSubject(job), body)
		nc.Flush()
		if !waitAll(ws, -1, 2*time.Second) {
			t.Fatal("not every rank aborted within 2 s")
		}
		for r, w := range ws {
			if !errors.Is(w.Err(), collective.ErrAborted) {
				t.Fatalf("rank %d: %v, want ErrAborted", r, w.Err())
			}
		}
	})
	t.Run("close in any order", func(t *testing.T) {
		ws, sk, _, _ := joinControl(t, n)
		order := rand.New(rand.NewPCG(1, 2)).Perm(n)
		closed := map[int]bool{}
		for _, r := range order[:n/2] {
			ws[r].Close()
			closed[r] = true
			time.Sleep(2 * time.Millisecond)
		}
		time.Sleep(2500 * time.Millisecond) // over two heartbeat timeouts
		for _, r := range order[n/2:] {
			if err := ws[r].Err(); err != nil {
				t.Fatalf("rank %d failed while half the ranks closed cleanly: %v", r, err)
			}
		}
		// An open rank whose watcher (the next rank) closed: its loss is still
		// seen, by the rank that took it over.
		victim := -1
		for _, r := range order[n/2:] {
			if closed[(r+1)%n] {
				victim = r
				break
			}
		}
		sk.mu.Lock()
		c := sk.conns[victim]
		sk.mu.Unlock()
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
		open := []*collective.World{}
		for _, r := range order[n/2:] {
			if r != victim {
				open = append(open, ws[r])
			}
		}
		if !waitAll(open, -1, 3*time.Second) {
			t.Fatalf("rank %d killed after its watcher closed: not every open rank failed within 3 s", victim)
		}
		for _, w := range open {
			var e *collective.Error
			if !errors.As(w.Err(), &e) || !errors.Is(e, collective.ErrPeerLost) || e.Rank != victim {
				t.Fatalf("rank %d: %v, want ErrPeerLost naming rank %d", w.Rank(), w.Err(), victim)
			}
		}
	})
}
