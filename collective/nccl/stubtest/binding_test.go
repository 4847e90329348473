//go:build cuda

package stubtest_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/collective/nccl"
	"github.com/meshrun/meshrun/kernels/sim"
	"github.com/meshrun/meshrun/tensor"
)

// stubbed skips unless TestBinding runs the test against the stand-ins,
// and gives the test a call log of its own.
func stubbed(t *testing.T) string {
	if os.Getenv("MESHRUN_NCCL_STUB") == "" {
		t.Skip("run by TestBinding against the stand-in libraries: go test ./collective/nccl/stubtest (without -tags cuda)")
	}
	log := filepath.Join(t.TempDir(), "calls.log")
	t.Setenv("MESHRUN_NCCL_STUB_LOG", log) // read by the stand-ins at every call
	return log
}

// call is one line of the stand-ins' log: the function and its arguments.
type call struct {
	name string
	args map[string]string
}

func (c call) String() string { return fmt.Sprintf("%s %v", c.name, c.args) }

// num reads argument k: a decimal, or a pointer as %p prints it.
func (c call) num(t *testing.T, k string) uint64 {
	t.Helper()
	v, ok := c.args[k]
	if !ok {
		t.Fatalf("%v: no %s", c, k)
	}
	if v == "(nil)" {
		return 0
	}
	n, err := strconv.ParseUint(strings.TrimPrefix(v, "0x"), map[bool]int{true: 16, false: 10}[strings.HasPrefix(v, "0x")], 64)
	if err != nil {
		t.Fatalf("%v: %s: %v", c, k, err)
	}
	return n
}

func readLog(t *testing.T, path string) []call {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var calls []call
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		c := call{name: f[0], args: map[string]string{}}
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			c.args[k] = v
		}
		calls = append(calls, c)
	}
	return calls
}

// worlds are n in-process worlds whose device collectives on sim memory go
// through the nccl backend over the real binding (nccl.Open), and their
// memories, each a device of its own (NCCL refuses two ranks of a
// communicator on one).
func worlds(t *testing.T, n int) ([]*collective.World, []*sim.Memory) {
	restore := sim.SeparateDevices()
	defer restore()
	b := collective.NCCLBackend(tensor.Sim, func(*collective.World) (collective.NCCL, error) {
		return nccl.Open(os.Getenv(collective.EnvNCCLLibrary))
	})
	ts, cs := collective.LocalTransports(n), collective.LocalControls(n)
	ws := make([]*collective.World, n)
	mems := make([]*sim.Memory, n)
	for r := range ws {
		w, err := collective.NewWorld(ts[r], cs[r], collective.Options{Collectives: collective.BackendNCCL,
			Backends: []collective.DeviceBackend{b}, DataTimeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ws[r], mems[r] = w, sim.NewMemory(0)
	}
	return ws, mems
}

func addr(x *tensor.Tensor, off int) uint64 {
	return uint64(x.Buffer().(interface{ Addr() uintptr }).Addr()) + uint64(off*x.DType().Size())
}

// NCCL's enums (nccl.h), as the binding must pass them.
var (
	ncclDType = map[tensor.DType]string{tensor.Float32: "7", tensor.Float64: "8", tensor.BFloat16: "9"}
	ncclOp    = map[collective.ReduceOp]string{collective.Sum: "0", collective.Max: "2", collective.Min: "3", collective.Avg: "4"}
)

// want is a library call a rank expects to have made, with the arguments
// it expects (pointers and numbers in decimal).
type want struct {
	name  string
	args  map[string]uint64
	group int // > 0: the rank's group (between ncclGroupStart and ncclGroupEnd) it is in
}

// TestBindingCalls: two ranks' collectives of every kind, dtype and
// reduction through the nccl backend over the binding: each library call
// with its arguments as NCCL's API takes them (the enums' values, the
// buffers' addresses and offsets, the counts, root and peer), on the
// communicator ncclCommInitRank made from the first rank's unique id, on
// the rank's memory's stream; grouped calls between ncclGroupStart and
// ncclGroupEnd on one OS thread; the completion polled with
// ncclCommGetAsyncError and cuStreamQuery on that stream until it is done
// (not ready for the first polls), ncclInProgress not taken for an error;
// each communicator destroyed at Close.
func TestBindingCalls(t *testing.T) {
	log := stubbed(t)
	lib, err := nccl.Open(os.Getenv(collective.EnvNCCLLibrary))
	if err != nil {
		t.Fatal(err)
	}
	if lib.Name() != "NCCL 2.21.5" {
		t.Errorf("library %q, want NCCL 2.21.5 (ncclGetVersion gives 22105)", lib.Name())
	}
	const n = 2
	ws, mems := worlds(t, n)
	t.Setenv("MESHRUN_CUDA_STUB_NOT_READY", "7") // the first polls find the stream busy
	ctx := context.Background()
	wants := make([][]want, n)
	collectives := make([]int, n)
	errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
		r := w.Rank()
		mem := mems[r]
		c, err := w.Communicator(ctx, []int{0, 1}, mem)
		if err != nil {
			return err
		}
		if c.Backend() != collective.BackendNCCL {
			return fmt.Errorf("backend %s", c.Backend())
		}
		alloc := func(dt tensor.DType, k int) *tensor.Tensor {
			x, err := mem.Alloc(dt, k)
			if err != nil {
				panic(err)
			}
			return x
		}
		group := 0
		expect := func(name string, grouped bool, args ...any) {
			w := want{name: name, args: map[string]uint64{"stream": uint64(mem.Stream())}}
			if grouped {
				w.group = group
			}
			for i := 0; i < len(args); i += 2 {
				switch v := args[i+1].(type) {
				case int:
					w.args[args[i].(string)] = uint64(v)
				case uint64:
					w.args[args[i].(string)] = v
				case string:
					u, _ := strconv.ParseUint(v, 10, 64)
					w.args[args[i].(string)] = u
				}
			}
			wants[r] = append(wants[r], w)
		}
		for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64, tensor.BFloat16} {
			buf := alloc(dt, 5)
			for _, op := range []collective.ReduceOp{collective.Sum, collective.Avg, collective.Max, collective.Min} {
				if err := c.AllReduce(ctx, buf, op); err != nil {
					return err
				}
				collectives[r]++
				expect("ncclAllReduce", false, "send", addr(buf, 0), "recv", addr(buf, 0), "count", 5, "datatype", ncclDType[dt], "op", ncclOp[op])
			}
		}
		buf := alloc(tensor.Float32, 5)
		if err := c.Broadcast(ctx, buf, 1); err != nil {
			return err
		}
		collectives[r]++
		expect("ncclBroadcast", false, "send", addr(buf, 0), "recv", addr(buf, 0), "count", 5, "datatype", "7", "root", 1)
		in, out := alloc(tensor.BFloat16, 3), alloc(tensor.BFloat16, 6)
		if err := c.AllGather(ctx, in, out, []int{3, 3}); err != nil {
			return err
		}
		collectives[r]++
		expect("ncclAllGather", false, "send", addr(in, 0), "recv", addr(out, 0), "count", 3, "datatype", "9")
		if err := c.ReduceScatter(ctx, out, in, []int{3, 3}, collective.Max); err != nil {
			return err
		}
		collectives[r]++
		expect("ncclReduceScatter", false, "send", addr(out, 0), "recv", addr(in, 0), "count", 3, "datatype", "9", "op", "2")
		// Uneven: grouped sends and receives, one reduce per member.
		counts, offs := []int{3, 2}, []int{0, 3}
		mine, whole := alloc(tensor.Float64, counts[r]), alloc(tensor.Float64, 5)
		if err := c.AllGather(ctx, mine, whole, counts); err != nil {
			return err
		}
		collectives[r]++
		group++
		for j := range n {
			expect("ncclSend", true, "send", addr(mine, 0), "count", counts[r], "datatype", "8", "peer", j)
			expect("ncclRecv", true, "recv", addr(whole, offs[j]), "count", counts[j], "datatype", "8", "peer", j)
		}
		if err := c.ReduceScatter(ctx, whole, mine, counts, collective.Min); err != nil {
			return err
		}
		collectives[r]++
		group++
		for j := range n {
			recv := addr(whole, offs[j])
			if j == r {
				recv = addr(mine, 0)
			}
			expect("ncclReduce", true, "send", addr(whole, offs[j]), "recv", recv, "count", counts[j], "datatype", "8", "op", "3", "root", j)
		}
		// Rank r sends a[r][p] elements to p and receives a[p][r] from it.
		a := [][]int{{1, 3}, {3, 2}}
		send, recv := alloc(tensor.Float32, a[r][0]+a[r][1]), alloc(tensor.Float32, a[0][r]+a[1][r])
		if err := c.AllToAll(ctx, send, a[r], recv, []int{a[0][r], a[1][r]}); err != nil {
			return err
		}
		collectives[r]++
		group++
		for j := range n {
			expect("ncclSend", true, "send", addr(send, j*a[r][0]), "count", a[r][j], "datatype", "7", "peer", j)
			expect("ncclRecv", true, "recv", addr(recv, j*a[0][r]), "count", a[j][r], "datatype", "7", "peer", j)
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	// ncclInProgress (7) from ncclCommGetAsyncError: still working, not an
	// error.
	t.Setenv("MESHRUN_NCCL_STUB_ASYNC", "0:7,1:7")
	errs = collectivetest.RunRanks(ws, func(w *collective.World) error {
		c, err := w.Communicator(ctx, []int{0, 1}, mems[w.Rank()])
		if err != nil {
			return err
		}
		x, err := mems[w.Rank()].Alloc(tensor.Float32, 8)
		if err != nil {
			return err
		}
		if err := c.AllReduce(ctx, x, collective.Sum); err != nil {
			return fmt.Errorf("with ncclInProgress from ncclCommGetAsyncError: %w", err)
		}
		collectives[w.Rank()]++
		wants[w.Rank()] = append(wants[w.Rank()], want{name: "ncclAllReduce", args: map[string]uint64{"send": addr(x, 0), "count": 8, "stream": uint64(mems[w.Rank()].Stream())}})
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for _, w := range ws {
		if err := w.Close(); err != nil {
			t.Errorf("rank %d: close: %v", w.Rank(), err)
		}
	}

	calls := readLog(t, log)
	// The unique id: made once, by rank 0, given to both ranks' init whole
	// (its last byte too).
	var id string
	comms := map[uint64]int{} // communicator handle -> rank
	for _, c := range calls {
		switch c.name {
		case "ncclGetUniqueId":
			if id != "" {
				t.Errorf("a second unique id: %v", c)
			}
			id = c.args["id"]
		case "ncclCommInitRank":
			if c.args["id"] != id || id == "" || c.args["last"] != "90" || c.args["nranks"] != "2" {
				t.Errorf("%v: want nranks=2 and the id %q (last byte 90)", c, id)
			}
			comms[c.num(t, "comm")] = int(c.num(t, "rank"))
		}
	}
	if len(comms) != n {
		t.Fatalf("%d communicators made, want %d: %v", len(comms), n, calls)
	}
	streams := map[uint64]int{}
	for r, m := range mems {
		streams[uint64(m.Stream())] = r
	}
	// Each rank's calls on its communicator, in order, as expected; the
	// stream of every call and poll is the rank's memory's.
	got := make([][]call, n)
	polls := make([]int, n)
	notReady, inProgress := 0, 0
	var destroyed, aborted []int
	for _, c := range calls {
		if _, ok := c.args["stream"]; ok {
			if _, ok := streams[c.num(t, "stream")]; !ok {
				t.Errorf("%v: on stream %s, not a rank's memory's (%v)", c, c.args["stream"], streams)
			}
		}
		switch c.name {
		case "cuStreamQuery":
			if c.args["result"] == "600" {
				notReady++
			}
			continue
		case "ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclGroupStart", "ncclGroupEnd":
			continue
		}
		r, ok := comms[c.num(t, "comm")]
		if !ok {
			t.Errorf("%v: not a communicator ncclCommInitRank made", c)
			continue
		}
		switch c.name {
		case "ncclCommGetAsyncError":
			polls[r]++
			if c.args["result"] == "7" {
				inProgress++
			}
		case "ncclCommDestroy":
			destroyed = append(destroyed, r)
		case "ncclCommAbort":
			aborted = append(aborted, r)
		default:
			got[r] = append(got[r], c)
		}
	}
	for r := range n {
		if len(got[r]) != len(wants[r]) {
			t.Errorf("rank %d: %d library calls, want %d:\n%v", r, len(got[r]), len(wants[r]), got[r])
			continue
		}
		for i, w := range wants[r] {
			c := got[r][i]
			if c.name != w.name {
				t.Errorf("rank %d: call %d is %v, want %s", r, i, c, w.name)
				continue
			}
			for k, v := range w.args {
				if g := c.num(t, k); g != v {
					t.Errorf("rank %d: call %d %v: %s=%#x (%d), want %#x (%d)", r, i, c, k, g, g, v, v)
				}
			}
		}
		if polls[r] < collectives[r] {
			t.Errorf("rank %d: %d polls of ncclCommGetAsyncError for its %d collectives", r, polls[r], collectives[r])
		}
	}
	if notReady != 7 {
		t.Errorf("%d polls found the stream busy, want 7 (the stand-in's first 7)", notReady)
	}
	if inProgress < n {
		t.Errorf("%d polls answered ncclInProgress, want one per rank at least", inProgress)
	}
	if len(destroyed) != n || len(aborted) != 0 {
		t.Errorf("at Close: destroyed %v, aborted %v; want each communicator destroyed, none aborted", destroyed, aborted)
	}
	checkGroups(t, calls, comms, wants)
}

// checkGroups checks that each grouped call was made between an
// ncclGroupStart and an ncclGroupEnd of its own OS thread (NCCL's group
// state is the thread's), that those hold nothing else, and that every rank
// made as many groups as it expected.
func checkGroups(t *testing.T, calls []call, comms map[uint64]int, wants [][]want) {
	t.Helper()
	open := map[string]int{}  // tid -> number of calls in its open group, -1: none open
	groups := map[int][]int{} // rank -> calls per group
	rankOf := map[string]int{}
	for _, c := range calls {
		tid := c.args["tid"]
		switch c.name {
		case "ncclGroupStart":
			if k, ok := open[tid]; ok && k >= 0 {
				t.Errorf("thread %s: ncclGroupStart inside a group", tid)
			}
			open[tid] = 0
			delete(rankOf, tid)
		case "ncclGroupEnd":
			k, ok := open[tid]
			if !ok || k < 0 {
				t.Errorf("thread %s: ncclGroupEnd without ncclGroupStart on that thread", tid)
				continue
			}
			r, ok := rankOf[tid]
			if !ok {
				t.Errorf("thread %s: an empty group", tid)
			}
			groups[r] = append(groups[r], k)
			open[tid] = -1
		case "ncclSend", "ncclRecv", "ncclReduce":
			r := comms[c.num(t, "comm")]
			if k, ok := open[tid]; !ok || k < 0 {
				t.Errorf("rank %d: %v outside a group of its thread (ncclGroupStart and ncclGroupEnd on another thread, or none)", r, c)
				continue
			}
			if q, ok := rankOf[tid]; ok && q != r {
				t.Errorf("thread %s: one group holds calls of ranks %d and %d", tid, q, r)
			}
			rankOf[tid] = r
			open[tid]++
		default:
			if k, ok := open[tid]; ok && k >= 0 && c.name != "cuStreamQuery" && c.name != "ncclCommGetAsyncError" {
				t.Errorf("thread %s: %v inside a group", tid, c)
			}
		}
	}
	for tid, k := range open {
		if k >= 0 {
			t.Errorf("thread %s: a group never ended", tid)
		}
	}
	for r, ws := range wants {
		var want []int
		for _, w := range ws {
			if w.group > 0 {
				for len(want) < w.group {
					want = append(want, 0)
				}
				want[w.group-1]++
			}
		}
		if fmt.Sprint(groups[r]) != fmt.Sprint(want) {
			t.Errorf("rank %d: groups of %v calls, want %v", r, groups[r], want)
		}
	}
}

// TestBindingAsyncError: an asynchronous error of rank 1's communicator
// (ncclRemoteError from ncclCommGetAsyncError) while both ranks' work runs
// fails every rank with ErrLibrary naming rank 1 and NCCL's own words, and
// aborts both communicators (none destroyed).
func TestBindingAsyncError(t *testing.T) {
	log := stubbed(t)
	t.Setenv("MESHRUN_NCCL_STUB_ASYNC", "1:6")
	t.Setenv("MESHRUN_CUDA_STUB_NOT_READY", "1000000000") // the work never completes
	ws, mems := worlds(t, 2)
	errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
		c, err := w.Communicator(context.Background(), []int{0, 1}, mems[w.Rank()])
		if err != nil {
			return err
		}
		x, err := mems[w.Rank()].Alloc(tensor.Float32, 8)
		if err != nil {
			return err
		}
		return c.AllReduce(context.Background(), x, collective.Sum)
	})
	for r, err := range errs {
		if !errors.Is(err, collective.ErrLibrary) || collective.Culprit(err) != 1 ||
			!strings.Contains(err.Error(), "ncclCommGetAsyncError: remote process exited or there was a network error (ncclResult 6)") {
			t.Errorf("rank %d: %v, want ErrLibrary naming rank 1 with NCCL's error", r, err)
		}
	}
	for _, w := range ws {
		w.Close()
	}
	aborted := map[string]bool{}
	for _, c := range readLog(t, log) {
		switch c.name {
		case "ncclCommAbort":
			aborted[c.args["comm"]] = true
		case "ncclCommDestroy":
			t.Errorf("%v after the failure", c)
		}
	}
	if len(aborted) != 2 {
		t.Errorf("communicators aborted: %v, want both", aborted)
	}
}

// TestBindingRefused: a library the binding cannot use (too old, a function
// missing, no file: the driver sets MESHRUN_NCCL_STUB_REFUSAL to what the
// refusal says) fails nccl.Open with the library's path and why, and a
// World asked for nccl with ErrNoLibrary saying so.
func TestBindingRefused(t *testing.T) {
	stubbed(t)
	why := os.Getenv("MESHRUN_NCCL_STUB_REFUSAL")
	if why == "" {
		t.Fatal("MESHRUN_NCCL_STUB_REFUSAL: what the refusal says")
	}
	_, err := nccl.Open(os.Getenv(collective.EnvNCCLLibrary))
	if err == nil || !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), os.Getenv(collective.EnvNCCLLibrary)) {
		t.Errorf("nccl.Open: %v, want the library's path and %q", err, why)
	}
	ws, mems := worlds(t, 1)
	defer ws[0].Close()
	if _, err := ws[0].Communicator(context.Background(), []int{0}, mems[0]); !errors.Is(err, collective.ErrNoLibrary) || !strings.Contains(err.Error(), why) {
		t.Errorf("communicator: %v, want %v saying %q", err, collective.ErrNoLibrary, why)
	}
}
