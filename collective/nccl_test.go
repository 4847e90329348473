package collective_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/tensor"
)

// TestConformanceNCCL runs the conformance suite through the nccl backend
// over the fake library: in-process ranks, and processes' worlds joined over
// NATS (the unique id and the bootstrap cross a real NATS server) on shared
// memory.
func TestConformanceNCCL(t *testing.T) {
	t.Run("local", func(t *testing.T) { collectivetest.RunOn(t, localWorlds, collectivetest.NCCL) })
	t.Run("shm", func(t *testing.T) { collectivetest.RunOn(t, joinedWorlds("shm"), collectivetest.NCCL) })
}

// ncclWorlds are n in-process worlds with the nccl backend over the fake
// library configured by fake, and their sim memories.
func ncclWorlds(t *testing.T, n int, timeout time.Duration, fake collective.FakeNCCLOptions) ([]*collective.World, []tensor.Memory) {
	o := collectivetest.SuiteOptions()
	o.DataTimeout = timeout
	return localWorlds(t, n, collectivetest.NCCLOptions(o, fake)), collectivetest.NCCL.Memories(n)
}

// allReduceTwice runs two all-reduces on every rank.
func allReduceTwice(t *testing.T, ws []*collective.World, mems []tensor.Memory) []error {
	return collectivetest.RunRanks(ws, func(w *collective.World) error {
		c, err := comm(w, mems)
		if err != nil {
			return err
		}
		buf := onDevice(t, mems, w.Rank(), 4096)
		for range 2 {
			if err := c.AllReduce(context.Background(), buf, collective.Sum); err != nil {
				return err
			}
		}
		return nil
	})
}

// TestNCCLFaults: failures inside the library (not at the descriptor check):
// work that never completes (a hung GPU) passes the collective's deadline, an
// asynchronous error, and a failure elsewhere in the job while every rank
// waits on the library. Each aborts every rank's communicator, and every
// rank fails with the typed error, none left waiting.
func TestNCCLFaults(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		timeout time.Duration
		fake    collective.FakeNCCLOptions
		failAt  time.Duration // > 0: rank 0's World is failed from outside then
		kind    error
		culprit int // < -1: any
		limit   time.Duration
		detail  string
	}{
		// The first to see the deadline names the failure: the stalled rank
		// (its work did not complete), or a peer whose share of the work
		// never heard from it (the fake's data moves over a host Group).
		{name: "stalled_work", n: 3, timeout: time.Second, fake: collective.FakeNCCLOptions{Stall: map[int]int{1: 2}},
			kind: collective.ErrTimeout, culprit: -2, limit: 4 * time.Second},
		{name: "async_error", n: 4, timeout: 30 * time.Second, fake: collective.FakeNCCLOptions{Fail: map[int]int{2: 2}},
			kind: collective.ErrLibrary, culprit: 2, limit: 3 * time.Second, detail: "unhandled cuda error"},
		// Every rank's work hangs; rank 0's World is failed from outside (as
		// an abort notice from the launcher does): all ranks abort and fail
		// at once, long before the 30 s deadline.
		{name: "job_aborted", n: 3, timeout: 30 * time.Second, fake: collective.FakeNCCLOptions{Stall: map[int]int{0: 1, 1: 1, 2: 1}},
			failAt: 300 * time.Millisecond, kind: collective.ErrAborted, culprit: -2, limit: 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leak := collectivetest.Goroutines(t)
			var aborted atomic.Int32
			tc.fake.Aborted = &aborted
			ws, mems := ncclWorlds(t, tc.n, tc.timeout, tc.fake)
			if tc.failAt > 0 {
				go func() {
					time.Sleep(tc.failAt)
					ws[0].Fail(errors.New("stopped by the launcher"))
				}()
			}
			start := time.Now()
			errs := allReduceTwice(t, ws, mems)
			expect(t, errs, -1, tc.kind, tc.culprit, time.Since(start), tc.limit)
			if !strings.Contains(errs[0].Error(), tc.detail) {
				t.Errorf("rank 0: %v", errs[0])
			}
			closeAll(ws)
			if a := int(aborted.Load()); a != tc.n {
				t.Errorf("%d communicators aborted, want %d", a, tc.n)
			}
			leak()
		})
	}
}

// stagedSayingWhy checks that every rank's world communicator is staged and
// runs, and that a "collective backend" log line says why (every one of
// the words).
func stagedSayingWhy(t *testing.T, ws []*collective.World, mems []tensor.Memory, logs *observer.ObservedLogs, words ...string) {
	t.Helper()
	errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
		c, err := comm(w, mems)
		if err != nil {
			return err
		}
		if c.Backend() != collective.BackendStaged {
			t.Errorf("rank %d: backend %s, want staged", w.Rank(), c.Backend())
		}
		return c.AllReduce(context.Background(), onDevice(t, mems, w.Rank(), 10), collective.Sum)
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	for _, e := range logs.FilterMessage("collective backend").All() {
		why, _ := e.ContextMap()["why"].(string)
		all := true
		for _, w := range words {
			all = all && strings.Contains(why, w)
		}
		if all {
			return
		}
	}
	t.Errorf("no log line saying why (%q): %v", words, logs.All())
}

// TestNCCLChoice: a World of one runs its collectives through the library;
// a library that cannot be loaded makes auto take the staged backend and say
// why, and makes nccl (asked for) fail before any data moves.
func TestNCCLChoice(t *testing.T) {
	t.Run("world_of_1", func(t *testing.T) {
		ws, mems := ncclWorlds(t, 1, 5*time.Second, collective.FakeNCCLOptions{})
		defer closeAll(ws)
		c, err := comm(ws[0], mems)
		if err != nil {
			t.Fatal(err)
		}
		h3, _ := tensor.FromFloat32([]float32{1, 2, 3}, 3)
		in, err := tensor.Upload(mems[0], h3)
		if err != nil {
			t.Fatal(err)
		}
		out := onDevice(t, mems, 0, 3)
		if err := c.AllReduce(context.Background(), in, collective.Sum); err != nil {
			t.Fatal(err)
		}
		if err := c.AllGather(context.Background(), in, out, []int{3}); err != nil {
			t.Fatal(err)
		}
		h, _ := tensor.Download(out)
		if got := h.Float32(); c.Backend() != "nccl" || c.Algorithm() != "nccl/all_gather" || got[0] != 1 || got[2] != 3 {
			t.Errorf("backend %s, algorithm %s, gathered %v", c.Backend(), c.Algorithm(), got)
		}
	})
	missing := collective.FakeNCCLOptions{Missing: "libnccl.so.2: cannot open shared object file: No such file or directory"}
	t.Run("missing_auto", func(t *testing.T) {
		core, logs := observer.New(zap.InfoLevel)
		o := collectivetest.NCCLOptions(collectivetest.SuiteOptions(), missing)
		o.Collectives, o.Logger = collective.BackendAuto, zap.New(core)
		ws, mems := localWorlds(t, 2, o), collectivetest.NCCL.Memories(2)
		defer closeAll(ws)
		stagedSayingWhy(t, ws, mems, logs, "libnccl.so.2: cannot open", "staged")
	})
	t.Run("missing_on_one_rank", func(t *testing.T) {
		// Rank 1 cannot load the library: under auto, both ranks take staged
		// (one backend per group), and rank 0's log says why.
		core, logs := observer.New(zap.InfoLevel)
		ts, cs := collective.LocalTransports(2), collective.LocalControls(2)
		ws := make([]*collective.World, 2)
		for r := range ws {
			fake := collective.FakeNCCLOptions{}
			if r == 1 {
				fake = missing
			}
			o := collectivetest.NCCLOptions(collectivetest.SuiteOptions(), fake)
			o.Collectives, o.Logger = collective.BackendAuto, zap.New(core).With(zap.Int("r", r))
			w, err := collective.NewWorld(ts[r], cs[r], o)
			if err != nil {
				t.Fatal(err)
			}
			ws[r] = w
		}
		defer closeAll(ws)
		mems := collectivetest.NCCL.Memories(2)
		stagedSayingWhy(t, ws, mems, logs, "unavailable on another member")
	})
	t.Run("missing_asked_for", func(t *testing.T) {
		ws := localWorlds(t, 2, collectivetest.NCCLOptions(collectivetest.SuiteOptions(), missing))
		defer closeAll(ws)
		mems := collectivetest.NCCL.Memories(2)
		errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
			_, err := comm(w, mems)
			return err
		})
		for r, err := range errs {
			if !errors.Is(err, collective.ErrNoLibrary) || !strings.Contains(err.Error(), "libnccl.so.2") {
				t.Errorf("rank %d: %v", r, err)
			}
		}
	})
}
