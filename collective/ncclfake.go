package collective

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/meshrun/meshrun/tensor"
)

// FakeNCCLOptions configure FakeNCCL.
type FakeNCCLOptions struct {
	// Resolve turns a device address and a byte count into the device's bytes
	// (kernels/sim's Resolve); it fails outside a live buffer, so a count or
	// offset the backend got wrong is an error, not a silent overrun.
	Resolve func(addr uintptr, n int) ([]byte, error)
	// Current returns the device context current on the calling OS thread,
	// "" when none is (kernels/sim's Current). The fake records it at
	// InitRank and, as NCCL, refuses any later call on the communicator
	// (Query, Abort and Destroy included) made without that context current.
	Current func() string
	// Missing, if set, is the error opening the library gives (as a machine
	// without libnccl.so.2 gives): auto falls back to staged collectives.
	Missing string
	// Stall maps a world rank to the number (1-based) of its communicator's
	// call whose work never completes until the communicator is aborted: a
	// hung GPU.
	Stall map[int]int
	// Fail maps a world rank to the number of its call that reports an
	// asynchronous error (ncclCommGetAsyncError) instead of completing.
	Fail map[int]int
	// Aborted, if set, counts Abort calls.
	Aborted *atomic.Int32
}

// FakeNCCL returns a library opener for NCCLBackend whose calls run over the
// host collectives of the World's transport, on the device memory Resolve
// reaches: the nccl backend's coordination (the unique id over the control
// plane, the communicator's bootstrap, grouped sends and receives, completion
// polled, abort) runs in the test suite without a GPU or NCCL.
//
// Like NCCL's, its calls enqueue work and return; the work runs on a
// goroutine (the stream) over a Group of the communicator's ranks of its own.
// Grouped calls must be made by every member of the communicator (as the
// backend makes them): sends and receives become one all-to-all, reduces
// rooted at every member one reduce-scatter.
//
// It refuses what NCCL refuses, with NCCL's "invalid usage": two ranks of a
// communicator on one device (their memories' device identities, compared
// at InitRank: every member fails), and a call made while another context
// than the one current at InitRank, or none, is current on the thread.
func FakeNCCL(o FakeNCCLOptions) func(w *World) (NCCL, error) {
	return func(w *World) (NCCL, error) {
		if o.Missing != "" {
			return nil, errors.New(o.Missing)
		}
		if o.Resolve == nil || o.Current == nil {
			return nil, fmt.Errorf("%w: FakeNCCL without Resolve or Current", ErrInvalid)
		}
		return &fakeNCCL{w: w, o: o}, nil
	}
}

type fakeNCCL struct {
	w *World
	o FakeNCCLOptions
}

func (f *fakeNCCL) Name() string { return "fake NCCL (host collectives)" }

func (f *fakeNCCL) UniqueID() ([]byte, error) {
	b := make([]byte, 16)
	rand.Read(b)
	return []byte("fake-nccl-" + hex.EncodeToString(b)), nil
}

// InitRank bootstraps as NCCL does through its root: each member offers its
// world rank and device identity under the id and asks for the others', then
// the members make their Group. It must be called with a context current,
// which every later call must have current too; members on one device are
// refused.
func (f *fakeNCCL) InitRank(mem tensor.Memory, n int, id []byte, rank int) (NCCLComm, error) {
	cur := f.o.Current()
	if cur == "" {
		return nil, errors.New("invalid usage: ncclCommInitRank with no device context current on the calling thread")
	}
	w := f.w
	ctx, cancel := context.WithTimeout(w.ctx, w.opts.DataTimeout)
	defer cancel()
	name := func(r int) string { return fmt.Sprintf("%s rank %d", id, r) }
	if err := w.ctrl.Offer(name(rank), []byte(strconv.Itoa(w.rank)+" "+deviceIdentity(mem))); err != nil {
		return nil, err
	}
	ranks := make([]int, n)
	devs := make([]string, n)
	for r := range ranks {
		v, err := w.ctrl.Ask(ctx, name(r))
		if err != nil {
			return nil, err
		}
		wr, dev, _ := strings.Cut(string(v), " ")
		if ranks[r], err = strconv.Atoi(wr); err != nil || dev == "" {
			return nil, fmt.Errorf("%w: bootstrap of %s: rank %d sent %q", ErrCorrupt, id, r, v)
		}
		devs[r] = dev
		for q := range r {
			if devs[q] == dev {
				return nil, fmt.Errorf("invalid usage: ranks %d and %d of the communicator are on one device %s", q, r, dev)
			}
		}
	}
	g, err := w.group(ctx, ranks, string(id))
	if err != nil {
		return nil, err
	}
	return &fakeComm{f: f, g: g, ctx: cur, abort: make(chan struct{})}, nil
}

// fakeOp is one call: its kind and arguments.
type fakeOp struct {
	kind              string
	send, recv        uintptr
	count, root, peer int
	dt                tensor.DType
	red               ReduceOp
}

type fakeComm struct {
	f   *fakeNCCL
	g   *Group
	ctx string // the context current at InitRank

	mu       sync.Mutex
	calls    int
	grouping int
	pending  []fakeOp
	running  chan struct{} // closed when the work in flight ends
	err      error         // the work's error
	abort    chan struct{}
	aborted  bool
}

// current refuses call unless the communicator's context is current on
// the calling thread, as NCCL does.
func (c *fakeComm) current(call string) error {
	switch cur := c.f.o.Current(); cur {
	case c.ctx:
		return nil
	case "":
		return fmt.Errorf("invalid usage: %s with no device context current on the calling thread (the communicator's is the %s)", call, c.ctx)
	default:
		return fmt.Errorf("invalid usage: %s with the %s current on the calling thread; the communicator was created in the %s", call, cur, c.ctx)
	}
}

func (c *fakeComm) enqueue(call string, op fakeOp) error {
	if err := c.current(call); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted {
		return errors.New("fake nccl: communicator aborted")
	}
	c.pending = append(c.pending, op)
	if c.grouping > 0 {
		return nil
	}
	return c.startLocked()
}

// startLocked runs the pending calls on a goroutine, as a stream would.
func (c *fakeComm) startLocked() error {
	if c.running != nil {
		select {
		case <-c.running:
		default:
			return errors.New("fake nccl: a call while the previous one runs (the backend waits for each)")
		}
	}
	ops := c.pending
	c.pending = nil
	c.calls++
	c.err = nil
	done := make(chan struct{})
	c.running = done
	me := c.f.w.rank
	stall, fail := c.f.o.Stall[me] == c.calls, c.f.o.Fail[me] == c.calls
	go func() {
		var err error
		switch {
		case stall:
			<-c.abort
			err = errors.New("fake nccl: aborted while stalled")
		case fail:
			err = fmt.Errorf("fake nccl: unhandled cuda error on rank %d (injected, call %d)", me, c.calls)
		default:
			err = c.run(ops)
		}
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(done)
	}()
	return nil
}

// run executes the calls on the host Group (its own context: the World's
// failure, which comes with every abort, ends them).
func (c *fakeComm) run(ops []fakeOp) error {
	ctx := context.Background()
	if len(ops) == 0 { // a group this member had nothing for: its peers' sends and receives may still pair with it
		return c.sendRecv(ctx, nil, nil)
	}
	first := ops[0]
	for _, op := range ops[1:] {
		if op.dt != first.dt || (op.kind == "reduce") != (first.kind == "reduce") {
			return fmt.Errorf("fake nccl: a group mixing %s and %s", first.kind, op.kind)
		}
	}
	es := first.dt.Size()
	n := c.g.Size()
	bytes := func(addr uintptr, count int) ([]byte, error) { return c.f.o.Resolve(addr, count*es) }
	switch first.kind {
	case "all_reduce", "broadcast":
		send, err := bytes(first.send, first.count)
		if err != nil {
			return err
		}
		recv, err := bytes(first.recv, first.count)
		if err != nil {
			return err
		}
		if first.kind == "all_reduce" {
			copy(recv, send)
			return hostAllReduce(ctx, c.g, first.dt, recv, first.red)
		}
		if c.g.me == first.root {
			copy(recv, send)
		}
		return hostBroadcast(ctx, c.g, first.dt, recv, first.root)
	case "all_gather", "reduce_scatter":
		whole := first.count * n
		counts := make([]int, n)
		for i := range counts {
			counts[i] = first.count
		}
		small, big := first.count, whole
		if first.kind == "reduce_scatter" {
			small, big = whole, first.count
		}
		send, err := bytes(first.send, small)
		if err != nil {
			return err
		}
		recv, err := bytes(first.recv, big)
		if err != nil {
			return err
		}
		if first.kind == "all_gather" {
			return hostAllGather(ctx, c.g, first.dt, send, recv, counts)
		}
		return hostReduceScatter(ctx, c.g, first.dt, send, recv, counts, first.red)
	case "reduce":
		return c.reduces(ctx, ops, bytes)
	case "send", "recv":
		return c.sendRecv(ctx, ops, bytes)
	}
	return fmt.Errorf("fake nccl: unknown call %s", first.kind)
}

// reduces runs reduces rooted at distinct members as one reduce-scatter.
func (c *fakeComm) reduces(ctx context.Context, ops []fakeOp, bytes func(uintptr, int) ([]byte, error)) error {
	n := c.g.Size()
	counts := make([]int, n)
	seen := make([]bool, n)
	for _, op := range ops {
		if op.root < 0 || op.root >= n || seen[op.root] || op.red != ops[0].red {
			return fmt.Errorf("fake nccl: grouped reduces must have distinct roots and one op")
		}
		seen[op.root] = true
		counts[op.root] = op.count
	}
	offs, total, _ := offsets(counts)
	in := make([]byte, total*ops[0].dt.Size())
	var mine fakeOp
	for _, op := range ops {
		b, err := bytes(op.send, op.count)
		if err != nil {
			return err
		}
		copy(in[offs[op.root]*ops[0].dt.Size():], b)
		if op.root == c.g.me {
			mine = op
		}
	}
	var out []byte
	if counts[c.g.me] > 0 {
		b, err := bytes(mine.recv, counts[c.g.me])
		if err != nil {
			return err
		}
		out = b
	}
	return hostReduceScatter(ctx, c.g, ops[0].dt, in, out, counts, ops[0].red)
}

// sendRecv runs a group of sends and receives (at most one each way per peer)
// as one all-to-all, of bytes (as pairs: every dtype's size is even), so that
// a member with nothing to send or receive takes part in it too.
func (c *fakeComm) sendRecv(ctx context.Context, ops []fakeOp, bytes func(uintptr, int) ([]byte, error)) error {
	n := c.g.Size()
	var sends, recvs = make([]*fakeOp, n), make([]*fakeOp, n)
	sc, rc := make([]int, n), make([]int, n)
	for i := range ops {
		op := &ops[i]
		if op.peer < 0 || op.peer >= n {
			return fmt.Errorf("fake nccl: peer %d of %d", op.peer, n)
		}
		side, counts := sends, sc
		if op.kind == "recv" {
			side, counts = recvs, rc
		}
		if side[op.peer] != nil {
			return fmt.Errorf("fake nccl: two %ss with peer %d in one group", op.kind, op.peer)
		}
		side[op.peer], counts[op.peer] = op, op.count*op.dt.Size()/2
	}
	const es = 2
	so, st, _ := offsets(sc)
	ro, rt, _ := offsets(rc)
	send, recv := make([]byte, st*es), make([]byte, rt*es)
	for p, op := range sends {
		if op != nil {
			b, err := bytes(op.send, op.count)
			if err != nil {
				return err
			}
			copy(send[so[p]*es:], b)
		}
	}
	if err := hostAllToAll(ctx, c.g, tensor.BFloat16, send, sc, recv, rc); err != nil {
		return err
	}
	for p, op := range recvs {
		if op != nil {
			b, err := bytes(op.recv, op.count)
			if err != nil {
				return err
			}
			copy(b, recv[ro[p]*es:ro[p+1]*es])
		}
	}
	return nil
}

func (c *fakeComm) AllReduce(send, recv uintptr, count int, dt tensor.DType, op ReduceOp) error {
	return c.enqueue("ncclAllReduce", fakeOp{kind: "all_reduce", send: send, recv: recv, count: count, dt: dt, red: op})
}

func (c *fakeComm) AllGather(send, recv uintptr, count int, dt tensor.DType) error {
	return c.enqueue("ncclAllGather", fakeOp{kind: "all_gather", send: send, recv: recv, count: count, dt: dt})
}

func (c *fakeComm) ReduceScatter(send, recv uintptr, count int, dt tensor.DType, op ReduceOp) error {
	return c.enqueue("ncclReduceScatter", fakeOp{kind: "reduce_scatter", send: send, recv: recv, count: count, dt: dt, red: op})
}

func (c *fakeComm) Broadcast(send, recv uintptr, count int, dt tensor.DType, root int) error {
	return c.enqueue("ncclBroadcast", fakeOp{kind: "broadcast", send: send, recv: recv, count: count, dt: dt, root: root})
}

func (c *fakeComm) Reduce(send, recv uintptr, count int, dt tensor.DType, op ReduceOp, root int) error {
	return c.enqueue("ncclReduce", fakeOp{kind: "reduce", send: send, recv: recv, count: count, dt: dt, red: op, root: root})
}

func (c *fakeComm) Send(buf uintptr, count int, dt tensor.DType, peer int) error {
	return c.enqueue("ncclSend", fakeOp{kind: "send", send: buf, count: count, dt: dt, peer: peer})
}

func (c *fakeComm) Recv(buf uintptr, count int, dt tensor.DType, peer int) error {
	return c.enqueue("ncclRecv", fakeOp{kind: "recv", recv: buf, count: count, dt: dt, peer: peer})
}

func (c *fakeComm) Grouped(f func() error) error {
	if err := c.current("ncclGroupStart"); err != nil {
		return err
	}
	c.mu.Lock()
	c.grouping++
	c.mu.Unlock()
	err := f()
	if err == nil {
		err = c.current("ncclGroupEnd")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.grouping--
	if err != nil {
		c.pending = nil
		return err
	}
	return c.startLocked()
}

func (c *fakeComm) Query() (bool, error) {
	if err := c.current("ncclCommGetAsyncError"); err != nil {
		return false, err
	}
	c.mu.Lock()
	running := c.running
	c.mu.Unlock()
	if running == nil {
		return true, nil
	}
	select {
	case <-running:
		c.mu.Lock()
		defer c.mu.Unlock()
		return true, c.err
	default:
		return false, nil
	}
}

func (c *fakeComm) Abort() error {
	if err := c.current("ncclCommAbort"); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.aborted {
		c.aborted = true
		close(c.abort)
		if a := c.f.o.Aborted; a != nil {
			a.Add(1)
		}
	}
	return nil
}

func (c *fakeComm) Destroy() error {
	if err := c.current("ncclCommDestroy"); err != nil {
		return err
	}
	c.mu.Lock()
	running := c.running
	c.mu.Unlock()
	if running != nil {
		<-running
	}
	return nil
}
