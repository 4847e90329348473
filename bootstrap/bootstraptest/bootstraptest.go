// Package bootstraptest joins in-process ranks of real jobs for tests: an
// embedded NATS server per job, ranks joined concurrently with bootstrap.Join
// over the transport a test names.
package bootstraptest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/natsrv"
	"github.com/meshrun/meshrun/transport"
	"github.com/nats-io/nats.go"
)

var jobCounter atomic.Int64

// NewJob returns a job id no other job of this process has.
func NewJob() string { return fmt.Sprintf("job%d", jobCounter.Add(1)) }

// StartServer starts an embedded NATS server for jobs, shut down when t ends.
func StartServer(t testing.TB, jobs ...string) *natsrv.Server {
	t.Helper()
	s, err := natsrv.Start(natsrv.Options{Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// AdminConn connects to s as its admin (what a launcher reads and sends),
// closed when the test ends.
func AdminConn(t testing.TB, s *natsrv.Server) *nats.Conn {
	t.Helper()
	admin := s.Admin()
	nc, err := nats.Connect(s.URL(), nats.UserInfo(admin.User, admin.Password))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Config is the Config of rank of n of job on s over transport.
func Config(s *natsrv.Server, job string, rank, n int, transport string, o collective.Options) bootstrap.Config {
	c, _ := s.Credentials(job)
	return bootstrap.Config{Rank: rank, WorldSize: n, Job: job, NATSURL: s.URL(), Creds: &c, Transport: transport,
		RendezvousTimeout: 10 * time.Second, Options: o}
}

// JoinAll joins n ranks concurrently and returns the worlds or the errors.
func JoinAll(cfgs []bootstrap.Config) ([]*collective.World, []error) {
	ws := make([]*collective.World, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i := range cfgs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ws[i], errs[i] = bootstrap.Join(context.Background(), cfgs[i])
		}()
	}
	wg.Wait()
	return ws, errs
}

// JoinedWorlds is the factory of worlds of a fresh job (and server) each,
// over transport.
func JoinedWorlds(transport string) collectivetest.Factory { return JoinedWorldsWith(transport, nil) }

// JoinedWorldsWith is JoinedWorlds with edit, if not nil, applied to every
// rank's Config.
func JoinedWorldsWith(transport string, edit func(*bootstrap.Config)) collectivetest.Factory {
	return func(t testing.TB, n int, o collective.Options) []*collective.World {
		job := NewJob()
		return JoinWorldsWith(t, StartServer(t, job), job, n, transport, o, edit)
	}
}

// JoinWorlds joins n ranks of job on s over transport; it fails t unless
// every rank joins over that transport.
func JoinWorlds(t testing.TB, s *natsrv.Server, job string, n int, transport string, o collective.Options) []*collective.World {
	return JoinWorldsWith(t, s, job, n, transport, o, nil)
}

// JoinWorldsWith is JoinWorlds with edit, if not nil, applied to every
// rank's Config.
func JoinWorldsWith(t testing.TB, s *natsrv.Server, job string, n int, transport string, o collective.Options, edit func(*bootstrap.Config)) []*collective.World {
	cfgs := make([]bootstrap.Config, n)
	for i := range cfgs {
		cfgs[i] = Config(s, job, i, n, transport, o)
		if edit != nil {
			edit(&cfgs[i])
		}
	}
	ws, errs := JoinAll(cfgs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: join: %v", i, err)
		}
	}
	for _, w := range ws {
		if got := w.Transport().Name(); got != transport {
			t.Fatalf("transport %s, want %s", got, transport)
		}
	}
	return ws
}

// RendezvousWatch reads, as the NATS admin, the roster of a job as rank 0
// publishes it to the other ranks: every rank's data address and ring token.
type RendezvousWatch struct {
	mu     sync.Mutex
	roster *collective.Roster
	nc     *nats.Conn
}

// WatchRendezvous subscribes, as the admin of s, to the rosters of its jobs.
func WatchRendezvous(t *testing.T, s *natsrv.Server) *RendezvousWatch {
	t.Helper()
	nc := AdminConn(t, s)
	w := &RendezvousWatch{nc: nc}
	if _, err := nc.Subscribe("meshrun.*.rdv.roster", func(m *nats.Msg) {
		_, data, _ := bytes.Cut(m.Data, []byte("\n")) // one chunk: a few ranks' roster
		if r, err := bootstrap.DecodeRoster(data); err == nil && len(r.Ranks) > 0 {
			w.mu.Lock()
			w.roster = &r
			w.mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return w
}

// RosterSeen returns the last roster seen, waiting up to 10 s for one.
func (w *RendezvousWatch) RosterSeen(t *testing.T) *collective.Roster {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		w.mu.Lock()
		r := w.roster
		w.mu.Unlock()
		if r != nil {
			return r
		}
	}
	t.Fatal("no roster seen")
	return nil
}

// AllReduceOnce sums rank+1 (and a larger vector) over the world and checks it.
func AllReduceOnce(ws []*collective.World) error {
	errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
		c, err := w.WorldGroup(context.Background())
		if err != nil {
			return err
		}
		buf := make([]float32, 5000)
		for i := range buf {
			buf[i] = float32(w.Rank() + 1 + i)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := collective.AllReduce(ctx, c, buf, collective.Sum); err != nil {
			return err
		}
		n := len(ws)
		for i, v := range buf {
			if want := float32(n*(n+1)/2 + n*i); v != want {
				return fmt.Errorf("rank %d: element %d is %v, want %v", w.Rank(), i, v, want)
			}
		}
		return nil
	})
	return errors.Join(errs...)
}

// Close ends the watch.
func (w *RendezvousWatch) Close() { w.nc.Close() }

// LeftRings lists the files under /dev/shm at the names the rings of the
// job of roster can have, other than those in planted.
func LeftRings(roster *collective.Roster, planted map[string]bool) []string {
	var left []string
	for _, p := range transport.ShmRingPaths(roster) {
		if _, err := os.Lstat(p); err == nil && !planted[p] {
			left = append(left, p)
		}
	}
	return left
}
