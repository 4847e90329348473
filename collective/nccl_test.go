package collective_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/collective/ncclfake"
	"github.com/meshrun/meshrun/internal/testtime"
	"github.com/meshrun/meshrun/kernels/sim"
	"github.com/meshrun/meshrun/tensor"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestConformanceNCCL runs the conformance suite through the nccl backend
// over the fake library: in-process ranks, and processes' worlds joined over
// NATS (the unique id and the bootstrap cross a real NATS server) on shared
// memory.
func TestConformanceNCCL(t *testing.T) {
	t.Run("local", func(t *testing.T) { collectivetest.RunOn(t, localWorlds, collectivetest.NCCL) })
	t.Run("shm", func(t *testing.T) { collectivetest.RunOn(t, bootstraptest.JoinedWorlds("shm"), collectivetest.NCCL) })
}

// ncclWorlds are n in-process worlds with the nccl backend over the fake
// library configured by fake, and their sim memories.
func ncclWorlds(t *testing.T, n int, timeout time.Duration, fake ncclfake.Options) ([]*collective.World, []tensor.Memory) {
	o := collectivetest.SuiteOptions()
	o.DataTimeout = timeout
	return localWorlds(t, n, collectivetest.NCCLOptions(o, fake)), collectivetest.NCCL.Memories(n)
}

// allReduceOnce runs one all-reduce of 100 floats on every rank of ws and
// returns each rank's error.
func allReduceOnce(t *testing.T, ws []*collective.World, mems []tensor.Memory) []error {
	return collectivetest.RunRanks(ws, func(w *collective.World) error {
		c, err := comm(w, mems)
		if err == nil {
			err = c.AllReduce(context.Background(), onDevice(t, mems, w.Rank(), 100), collective.Sum)
		}
		return err
	})
}

// allReduceTwice runs two all-reduces on rank w.
func allReduceTwice(t *testing.T, w *collective.World, mems []tensor.Memory) error {
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
}

// closeWithin closes the worlds and fails the test if that takes longer
// than limit (scaled): a Close waiting on library work that nothing aborted
// fails the test here instead of hanging it until go test's timeout.
func closeWithin(t *testing.T, ws []*collective.World, limit time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		closeAll(ws)
		close(done)
	}()
	limit = testtime.Scale(limit)
	select {
	case <-done:
	case <-time.After(limit):
		t.Fatalf("closing the worlds took more than %v: a communicator's work was never aborted", limit)
	}
}

// TestNCCLFaults: failures inside the library (not at the descriptor check):
// work that never completes (a hung GPU) passes the collective's deadline, an
// asynchronous error, and a failure elsewhere in the job while every rank
// waits on the library. On every rank the failing call aborts its
// communicator before it returns (none is left with the library's work in
// flight, nothing left to the abort of idle communicators or to Close), and
// returns the typed error naming the same culprit, with what happened.
func TestNCCLFaults(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		timeout time.Duration
		fake    ncclfake.Options
		failAt  time.Duration // > 0: rank 0's World is failed from outside then
		kind    error
		culprit int
		limit   time.Duration
		detail  string
	}{
		// Rank 1's work never completes, and every other rank's waits on
		// it: from the host, no rank can tell whose GPU hangs (with NCCL
		// neither), so every rank names none; the first to see the
		// deadline tells the others.
		{name: "stalled_work", n: 3, timeout: time.Second, fake: ncclfake.Options{Stall: map[int]int{1: 2}},
			kind: collective.ErrTimeout, culprit: -1, limit: 4 * time.Second, detail: "the work did not complete in"},
		{name: "async_error", n: 4, timeout: 30 * time.Second, fake: ncclfake.Options{Fail: map[int]int{2: 2}},
			kind: collective.ErrLibrary, culprit: 2, limit: 3 * time.Second, detail: "unhandled cuda error on rank 2"},
		// Every rank's work hangs; rank 0's World is failed from outside (as
		// an abort notice from the launcher does): all ranks abort and fail
		// at once, long before the 30 s deadline, naming rank 0.
		{name: "job_aborted", n: 3, timeout: 30 * time.Second, fake: ncclfake.Options{Stall: map[int]int{0: 1, 1: 1, 2: 1}},
			failAt: 300 * time.Millisecond, kind: collective.ErrAborted, culprit: 0, limit: 3 * time.Second, detail: "stopped by the launcher"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leak := collectivetest.Goroutines(t)
			// returned[r] is closed when rank r's failing call has returned.
			// An abort made inside the call holds it: waiting here a while,
			// it sees the call still running; an abort made after the call
			// returned (by the abort of idle communicators) sees it return.
			returned := make([]chan struct{}, tc.n)
			for r := range returned {
				returned[r] = make(chan struct{})
			}
			var mu sync.Mutex
			aborts := make([]int, tc.n)
			var late []int
			grace := testtime.Scale(200 * time.Millisecond)
			tc.fake.OnAbort = func(r int) {
				select {
				case <-returned[r]:
					mu.Lock()
					late = append(late, r)
					mu.Unlock()
				case <-time.After(grace):
				}
				mu.Lock()
				aborts[r]++
				mu.Unlock()
			}
			ws, mems := ncclWorlds(t, tc.n, tc.timeout, tc.fake)
			if tc.failAt > 0 {
				go func() {
					time.Sleep(tc.failAt)
					ws[0].Fail(errors.New("stopped by the launcher"))
				}()
			}
			start := time.Now()
			errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
				err := allReduceTwice(t, w, mems)
				close(returned[w.Rank()])
				return err
			})
			expect(t, errs, -1, tc.kind, tc.culprit, time.Since(start), testtime.Scale(tc.limit)+2*grace)
			for r, err := range errs {
				if !strings.Contains(err.Error(), tc.detail) {
					t.Errorf("rank %d: %v, want it to say %q", r, err, tc.detail)
				}
			}
			// Read before Close, which aborts what is left.
			mu.Lock()
			for r, a := range aborts {
				if a != 1 {
					t.Errorf("rank %d: %d aborts of its communicator when its call returned, want 1", r, a)
				}
			}
			if len(late) > 0 {
				t.Errorf("ranks %v returned from the failing call before aborting their communicator", late)
			}
			mu.Unlock()
			closeWithin(t, ws, 5*time.Second)
			leak()
		})
	}
}

// TestNCCLIdleAbort: a failure anywhere in the job aborts the idle
// communicators of every rank too (from the World's failure, on another
// goroutine than the rank's: in the device's context all the same, or the
// library refuses the abort). Worlds closed healthy abort none (Close
// destroys them).
func TestNCCLIdleAbort(t *testing.T) {
	leak := collectivetest.Goroutines(t)
	var aborted atomic.Int32
	run := func(ws []*collective.World, mems []tensor.Memory) {
		t.Helper()
		for r, err := range allReduceOnce(t, ws, mems) {
			if err != nil {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
	}
	ws, mems := ncclWorlds(t, 2, 30*time.Second, ncclfake.Options{Aborted: &aborted})
	run(ws, mems)
	closeWithin(t, ws, 5*time.Second)
	if a := aborted.Load(); a != 0 {
		t.Errorf("%d communicators aborted by closing healthy worlds, want 0", a)
	}
	ws, mems = ncclWorlds(t, 2, 30*time.Second, ncclfake.Options{Aborted: &aborted})
	run(ws, mems)
	ws[0].Fail(errors.New("stopped by the launcher"))
	for start := time.Now(); aborted.Load() < 2 && time.Since(start) < testtime.Scale(3*time.Second); {
		time.Sleep(10 * time.Millisecond)
	}
	if a := aborted.Load(); a != 2 { // before Close, which would abort them too
		t.Errorf("%d idle communicators aborted, want 2", a)
	}
	closeWithin(t, ws, 5*time.Second)
	leak()
}

// TestNCCLLateInit: an init that gave up (the World failed while rank 0's
// library was still making its communicator) has what the library returns
// afterwards aborted before World.Close returns: no call of the library
// outlives the World (the stub library's test once saw Close return first).
func TestNCCLLateInit(t *testing.T) {
	leak := collectivetest.Goroutines(t)
	var aborted [2]atomic.Int32
	delay := testtime.Scale(400 * time.Millisecond)
	ws, mems := ncclWorlds(t, 2, 30*time.Second, ncclfake.Options{InitDelay: map[int]time.Duration{0: delay},
		OnAbort: func(r int) { aborted[r].Add(1) }})
	go func() {
		time.Sleep(delay / 4)
		ws[1].Fail(errors.New("stopped by the launcher"))
	}()
	for r, err := range allReduceOnce(t, ws, mems) {
		if err == nil || !strings.Contains(err.Error(), "stopped by the launcher") {
			t.Errorf("rank %d: %v, want the launcher's stop", r, err)
		}
	}
	closeWithin(t, ws, 5*time.Second)
	if a := aborted[0].Load(); a != 1 {
		t.Errorf("rank 0's late communicator aborted %d times when Close returned, want 1", a)
	}
	leak()
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
		ws, mems := ncclWorlds(t, 1, 5*time.Second, ncclfake.Options{})
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
	missing := ncclfake.Options{Missing: "libnccl.so.2: cannot open shared object file: No such file or directory"}
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
			fake := ncclfake.Options{}
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

// sharedMemories are n sim memories on one device (sim:0 of this process),
// as n in-process ranks on one GPU are.
func sharedMemories(n int) []tensor.Memory {
	ms := make([]tensor.Memory, n)
	for r := range ms {
		ms[r] = sim.NewMemory(0)
	}
	return ms
}

// TestNCCLSharedDevice: NCCL refuses two ranks of a communicator on one
// device. Under auto, a group whose members share one takes staged and says
// which ranks share which device; asked for (MESHRUN_COLLECTIVES=nccl), it is
// refused on every member, naming them, before any data moves. A group on
// devices of its own in the same world still takes nccl.
func TestNCCLSharedDevice(t *testing.T) {
	t.Run("auto", func(t *testing.T) {
		core, logs := observer.New(zap.InfoLevel)
		o := collectivetest.NCCLOptions(collectivetest.SuiteOptions(), ncclfake.Options{})
		o.Collectives, o.Logger = collective.BackendAuto, zap.New(core)
		ws := localWorlds(t, 3, o)
		defer closeAll(ws)
		// Ranks 0 and 2 share a device; rank 1 has one of its own.
		mems := []tensor.Memory{sim.NewMemory(0), sim.NewMemory(1), sim.NewMemory(0)}
		stagedSayingWhy(t, ws, mems, logs, "auto: ranks 0 and 2 share device "+mems[0].(*sim.Memory).DeviceID()+" ", "staged instead")
		// The pair on devices of their own takes nccl.
		errs := collectivetest.RunRanks(ws[:2], func(w *collective.World) error {
			c, err := w.Communicator(context.Background(), []int{0, 1}, mems[w.Rank()])
			if err == nil && c.Backend() != collective.BackendNCCL {
				err = errors.New("backend " + c.Backend())
			}
			if err == nil {
				err = c.AllReduce(context.Background(), onDevice(t, mems, w.Rank(), 10), collective.Sum)
			}
			return err
		})
		for r, err := range errs {
			if err != nil {
				t.Errorf("ranks 0 and 1, rank %d: %v", r, err)
			}
		}
	})
	t.Run("asked_for", func(t *testing.T) {
		ws := localWorlds(t, 2, collectivetest.NCCLOptions(collectivetest.SuiteOptions(), ncclfake.Options{}))
		defer closeAll(ws)
		mems := sharedMemories(2)
		errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
			_, err := comm(w, mems)
			return err
		})
		want := "ranks 0 and 1 share device " + mems[0].(*sim.Memory).DeviceID() + ", and NCCL"
		for r, err := range errs {
			if !errors.Is(err, collective.ErrSharedDevice) || !strings.Contains(err.Error(), want) {
				t.Errorf("rank %d: %v, want %v saying %q", r, err, collective.ErrSharedDevice, want)
			}
			if tr := mems[r].Transfers(); tr != (tensor.Transfers{}) {
				t.Errorf("rank %d: data moved: %+v", r, tr)
			}
		}
	})
}

// TestFakeNCCLRefuses: the fake library refuses what NCCL refuses, with its
// "invalid usage": a communicator created without a context current, a call
// on one made with no context or another context current than at its
// creation (Query, Abort and Destroy included), and two ranks of one
// communicator on one device (every member fails at InitRank).
func TestFakeNCCLRefuses(t *testing.T) {
	fake := ncclfake.Options{Resolve: sim.Resolve, Current: sim.Current}
	t.Run("context", func(t *testing.T) {
		ws := localWorlds(t, 1, collectivetest.SuiteOptions())
		defer closeAll(ws)
		lib, err := ncclfake.New(fake)(ws[0])
		if err != nil {
			t.Fatal(err)
		}
		mem, other := sim.NewMemory(0), sim.NewMemory(1)
		id, _ := lib.UniqueID()
		if _, err := lib.InitRank(mem, 1, id, 0); err == nil || !strings.Contains(err.Error(), "invalid usage: ncclCommInitRank with no device context current") {
			t.Errorf("InitRank without a context: %v", err)
		}
		id, _ = lib.UniqueID()
		var nc collective.NCCLComm
		if err := mem.Run(func() error {
			nc, err = lib.InitRank(mem, 1, id, 0)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		h, _ := tensor.FromFloat32([]float32{1, 2, 3, 4}, 4)
		buf, _ := tensor.Upload(mem, h)
		addr := buf.Buffer().(interface{ Addr() uintptr }).Addr()
		calls := []struct {
			name string
			call func() error
		}{
			{"ncclAllReduce", func() error { return nc.AllReduce(addr, addr, 4, tensor.Float32, collective.Sum) }},
			{"ncclBroadcast", func() error { return nc.Broadcast(addr, addr, 4, tensor.Float32, 0) }},
			{"ncclGroupStart", func() error { return nc.Grouped(func() error { return nil }) }},
			{"ncclCommGetAsyncError", func() error { _, err := nc.Query(); return err }},
			{"ncclCommAbort", nc.Abort},
			{"ncclCommDestroy", nc.Destroy},
		}
		for _, c := range calls {
			if err := c.call(); err == nil || !strings.Contains(err.Error(), "invalid usage: "+c.name+" with no device context current") {
				t.Errorf("%s without a context: %v", c.name, err)
			}
			err := other.Run(c.call)
			if err == nil || !strings.Contains(err.Error(), "invalid usage: "+c.name+" with the "+other.Context()+" current") ||
				!strings.Contains(err.Error(), "created in the "+mem.Context()) {
				t.Errorf("%s with another context: %v", c.name, err)
			}
		}
		// With its context current, the communicator works.
		err = mem.Run(func() error {
			if err := nc.AllReduce(addr, addr, 4, tensor.Float32, collective.Sum); err != nil {
				return err
			}
			for {
				if done, err := nc.Query(); done || err != nil {
					return err
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := mem.Run(nc.Destroy); err != nil {
			t.Fatal(err)
		}
		// The calls above took buf by its address alone: it must outlive
		// them (a collected sim buffer forgets its address).
		runtime.KeepAlive(buf)
	})
	for _, tc := range []struct {
		name string
		mems []tensor.Memory
		err  string
	}{
		{"one_device", sharedMemories(2), "invalid usage: ranks 0 and 1 of the communicator are on one device " + sim.NewMemory(0).DeviceID()},
		{"two_devices", []tensor.Memory{sim.NewMemory(0), sim.NewMemory(1)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := localWorlds(t, 2, collectivetest.SuiteOptions())
			defer closeAll(ws)
			libs := make([]collective.NCCL, 2)
			for r, w := range ws {
				var err error
				if libs[r], err = ncclfake.New(fake)(w); err != nil {
					t.Fatal(err)
				}
			}
			id, _ := libs[0].UniqueID()
			errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
				mem := tc.mems[w.Rank()].(*sim.Memory)
				return mem.Run(func() error {
					nc, err := libs[w.Rank()].InitRank(mem, 2, id, w.Rank())
					if err == nil {
						err = nc.Destroy()
					}
					return err
				})
			})
			for r, err := range errs {
				if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
					t.Errorf("rank %d: %v, want %q", r, err, tc.err)
				}
			}
		})
	}
}
