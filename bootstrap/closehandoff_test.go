package bootstrap_test

import (
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/internal/testtime"
)

// TestCloseWhileTakingOver: a World's Close does not wait for a state
// request of its control plane in flight. Rank 1 of 3 closes; its last
// heartbeat names rank 0, which it watched, and rank 2, its watcher, takes
// rank 0 over, asking it for its state first (at most two heartbeat
// intervals, 1 s at the default 500 ms). Rank 0's socket is frozen, as a
// stopped process's, or one on its way out, leaves it: the request goes
// unanswered. Rank 2 closes 100 ms later, as a survivor of a torn-down job
// does; its Close returned only when the request timed out, 1.0 s after,
// which is what a launcher waited for after one rank of a job was
// SIGTERMed (one survivor exiting 1.0 s after the others).
func TestCloseWhileTakingOver(t *testing.T) {
	job := bootstraptest.NewJob()
	s := bootstraptest.StartServer(t, job)
	sk := &sockets{conns: map[int]*rankConn{}}
	const n = 3
	cfgs := make([]bootstrap.Config, n)
	for r := range cfgs {
		cfgs[r] = bootstraptest.Config(s, job, r, n, "none", collective.Options{})
		cfgs[r].HeartbeatInterval, cfgs[r].HeartbeatTimeout = 500*time.Millisecond, 5*time.Second
		cfgs[r].Dialer = rankDialer{sk, r}
	}
	ws, errs := bootstraptest.JoinAll(cfgs)
	t.Cleanup(func() {
		sk.conn(0).kill() // a frozen rank's Close would wait for its socket
		for _, w := range ws {
			if w != nil {
				w.Close()
			}
		}
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: join: %v", r, err)
		}
	}
	time.Sleep(200 * time.Millisecond) // every rank heard its predecessor
	sk.conn(0).freeze()
	ws[1].Close()
	time.Sleep(100 * time.Millisecond) // rank 2 asks rank 0 for its state
	start := time.Now()
	ws[2].Close()
	took := time.Since(start)
	t.Logf("rank 2 closed in %v", took.Round(time.Millisecond))
	if limit := testtime.Scale(200 * time.Millisecond); took > limit {
		t.Errorf("rank 2's Close took %v, want < %v: it waited for its state request to frozen rank 0", took.Round(time.Millisecond), limit)
	}
}
