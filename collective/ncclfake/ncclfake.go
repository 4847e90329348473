// Package ncclfake is a fake NCCL: a library for the nccl collective backend
// (collective.NCCLBackend) that moves device bytes over the World's
// transport, so that the CUDA path's collective coordination runs without a
// GPU. Nothing registers it: a test gives it to a World's Options.Backends,
// and a worker on sim devices chooses it with MESHRUN_NCCL_LIBRARY=fake
// (package job).
package ncclfake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/tensor"
)

// Options configure the fake library.
type Options struct {
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
	// OnAbort, if set, is called by each communicator's first Abort with
	// the World's rank, on the aborting goroutine (inside the memory's Run,
	// before Abort returns).
	OnAbort func(rank int)
	// InitDelay holds a world rank's InitRank this long once its
	// communicator is made, whatever happens meanwhile: a library that
	// returns a communicator after its caller gave up.
	InitDelay map[int]time.Duration
}

// New returns a library opener for collective.NCCLBackend whose calls move the
// device memory Resolve reaches over the World's transport: the nccl
// backend's coordination (the unique id over the control plane, the
// communicator's bootstrap, grouped sends and receives, completion polled,
// abort) runs in the test suite without a GPU or NCCL.
//
// Like NCCL's, its calls enqueue work and return; the work runs on a
// goroutine (the stream). Like NCCL, it moves bytes and checks nothing of
// what the members called: each call (or group of calls) is one exchange
// of raw bytes among the communicator's members, over a Group of their
// ranks that is the library's own, under a header that is the same for every
// call (no op, dtype, count or root in it). Members whose calls disagree
// get wrong results without an error where the byte counts happen to match,
// and otherwise wait until the communicator is aborted, as NCCL's kernels
// hang: the descriptor check of the backend (ncclComm.run) is the only one
// that can report a mismatch. Grouped calls must be made by every member of
// the communicator (as the backend makes them).
//
// It refuses what NCCL refuses, with NCCL's "invalid usage": two ranks of a
// communicator on one device (their memories' device identities, compared
// at InitRank: every member fails), and a call made while another context
// than the one current at InitRank, or none, is current on the thread.
func New(o Options) func(w *collective.World) (collective.NCCL, error) {
	return func(w *collective.World) (collective.NCCL, error) {
		if o.Missing != "" {
			return nil, errors.New(o.Missing)
		}
		if o.Resolve == nil || o.Current == nil {
			return nil, fmt.Errorf("%w: ncclfake.New without Resolve or Current", collective.ErrInvalid)
		}
		return &fakeNCCL{w: w, o: o}, nil
	}
}

type fakeNCCL struct {
	w *collective.World
	o Options
}

func (f *fakeNCCL) Name() string { return "fake NCCL (bytes over the transport)" }

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
func (f *fakeNCCL) InitRank(mem tensor.Memory, n int, id []byte, rank int) (collective.NCCLComm, error) {
	cur := f.o.Current()
	if cur == "" {
		return nil, errors.New("invalid usage: ncclCommInitRank with no device context current on the calling thread")
	}
	w := f.w
	ctx, cancel := context.WithTimeout(w.Context(), w.Options().DataTimeout)
	defer cancel()
	name := func(r int) string { return fmt.Sprintf("%s rank %d", id, r) }
	if err := w.Control().Offer(name(rank), []byte(strconv.Itoa(w.Rank())+" "+collective.DeviceIdentity(mem))); err != nil {
		return nil, err
	}
	ranks := make([]int, n)
	devs := make([]string, n)
	for r := range ranks {
		v, err := w.Control().Ask(ctx, name(r))
		if err != nil {
			return nil, err
		}
		wr, dev, _ := strings.Cut(string(v), " ")
		if ranks[r], err = strconv.Atoi(wr); err != nil || dev == "" {
			return nil, fmt.Errorf("%w: bootstrap of %s: rank %d sent %q", collective.ErrCorrupt, id, r, v)
		}
		devs[r] = dev
		for q := range r {
			if devs[q] == dev {
				return nil, fmt.Errorf("invalid usage: ranks %d and %d of the communicator are on one device %s", q, r, dev)
			}
		}
	}
	g, err := w.LibraryGroup(ctx, ranks, string(id))
	if err != nil {
		return nil, err
	}
	time.Sleep(f.o.InitDelay[w.Rank()])
	return &fakeComm{f: f, g: g, ctx: cur, abort: make(chan struct{})}, nil
}

// fakeOp is one call: its kind and arguments.
type fakeOp struct {
	kind              string
	send, recv        uintptr
	count, root, peer int
	dt                tensor.DType
	red               collective.ReduceOp
}

type fakeComm struct {
	f   *fakeNCCL
	g   *collective.Group
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
	me := c.f.w.Rank()
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

// run executes one call (or one group of calls) as one exchange of bytes
// among the members: each member sends every member the bytes that its part
// of the call gives that member, and takes what it receives as its own call
// says (NCCL's kernels read and write the bytes their own arguments name).
// Nothing checks that the members called the same: a member that receives
// another number of bytes from a member than its call takes waits, as
// NCCL's kernels wait for data that never comes, until the communicator is
// aborted (the backend's deadline does it); equal byte counts under
// different calls give wrong results and no error.
func (c *fakeComm) run(ops []fakeOp) error {
	n := c.g.Size()
	out, want := make([][]byte, n), make([]int, n)
	finish, err := c.plan(ops, out, want)
	if err != nil {
		return err
	}
	var in [][]byte
	if len(ops) == 0 || ops[0].kind == "send" || ops[0].kind == "recv" {
		// Point to point (a member with nothing in a group of sends and
		// receives too): bytes move one way, from the members that send
		// to those that receive, as NCCL's do (a pair's other direction
		// may carry another communicator's traffic meanwhile).
		to, from := make([]bool, n), make([]bool, n)
		for _, op := range ops {
			if op.kind == "send" {
				to[op.peer] = true
			} else {
				from[op.peer] = true
			}
		}
		in, err = c.g.ExchangeSome(out, to, from)
	} else {
		in, err = c.g.Exchange(out)
	}
	if err != nil {
		return err
	}
	for p := range n {
		if len(in[p]) != want[p] {
			<-c.abort
			return fmt.Errorf("fake nccl: aborted while waiting: member %d of the communicator sent %d bytes where this member's call takes %d", p, len(in[p]), want[p])
		}
	}
	if finish == nil {
		return nil
	}
	return finish(in)
}

// plan sets out[p], the bytes this member sends member p (itself included),
// and want[p], the number of bytes its call takes from member p; finish
// writes the call's output from what came (in[p] from member p).
func (c *fakeComm) plan(ops []fakeOp, out [][]byte, want []int) (finish func(in [][]byte) error, err error) {
	if len(ops) == 0 { // a group this member had nothing for: its peers' sends may still be for it
		return nil, nil
	}
	first := ops[0]
	for _, op := range ops[1:] {
		if op.dt != first.dt || (op.kind == "reduce") != (first.kind == "reduce") {
			return nil, fmt.Errorf("fake nccl: a group mixing %s and %s", first.kind, op.kind)
		}
	}
	es := first.dt.Size()
	bytes := func(addr uintptr, count int) ([]byte, error) { return c.f.o.Resolve(addr, count*es) }
	switch first.kind {
	case "all_reduce", "broadcast", "all_gather", "reduce_scatter":
		return c.planCollective(ops, out, want, bytes)
	case "reduce":
		return c.planReduce(ops, out, want, bytes)
	case "send", "recv":
		return c.planP2P(ops, out, want, bytes)
	}
	return nil, fmt.Errorf("fake nccl: unknown call %s", first.kind)
}

// resolver returns the device bytes of count elements at addr.
type resolver func(addr uintptr, count int) ([]byte, error)

// planCollective plans one all-reduce, broadcast, all-gather or
// reduce-scatter (see plan).
func (c *fakeComm) planCollective(ops []fakeOp, out [][]byte, want []int, bytes resolver) (func(in [][]byte) error, error) {
	first := ops[0]
	dt, es, n, me := first.dt, first.dt.Size(), c.g.Size(), c.g.Index()
	if len(ops) > 1 {
		return nil, fmt.Errorf("fake nccl: %s grouped with other calls", first.kind)
	}
	small, big := first.count, first.count
	switch first.kind {
	case "all_gather":
		big = first.count * n
	case "reduce_scatter":
		small = first.count * n
	}
	send, err := bytes(first.send, small)
	if err != nil {
		return nil, err
	}
	recv, err := bytes(first.recv, big)
	if err != nil {
		return nil, err
	}
	seg := first.count * es
	switch first.kind {
	case "all_reduce":
		for p := range n {
			out[p], want[p] = send, seg
		}
		return func(in [][]byte) error {
			copy(recv, collective.ReduceBytes(dt, in, first.red))
			return nil
		}, nil
	case "broadcast":
		if first.root < 0 || first.root >= n {
			return nil, fmt.Errorf("fake nccl: broadcast root %d of %d", first.root, n)
		}
		if me == first.root {
			for p := range n {
				out[p] = send
			}
		}
		want[first.root] = seg
		return func(in [][]byte) error {
			copy(recv, in[first.root])
			return nil
		}, nil
	case "all_gather":
		for p := range n {
			out[p], want[p] = send, seg
		}
		return func(in [][]byte) error {
			mine := slices.Clone(in[me]) // the input may be the output's own segment
			for p := range n {
				if p != me {
					copy(recv[p*seg:], in[p])
				}
			}
			copy(recv[me*seg:], mine)
			return nil
		}, nil
	default: // reduce_scatter
		for p := range n {
			out[p], want[p] = send[p*seg:(p+1)*seg], seg
		}
		return func(in [][]byte) error {
			copy(recv, collective.ReduceBytes(dt, in, first.red))
			return nil
		}, nil
	}
}

// planReduce plans reduces rooted at distinct members (see plan).
func (c *fakeComm) planReduce(ops []fakeOp, out [][]byte, want []int, bytes resolver) (func(in [][]byte) error, error) {
	first := ops[0]
	dt, es, n, me := first.dt, first.dt.Size(), c.g.Size(), c.g.Index()
	// Reduces rooted at distinct members, one op: each member sends
	// each root its input for that root; a root reduces what came.
	var mine *fakeOp
	for i := range ops {
		op := &ops[i]
		if op.root < 0 || op.root >= n || out[op.root] != nil || op.red != first.red {
			return nil, fmt.Errorf("fake nccl: grouped reduces must have distinct roots and one op")
		}
		b, err := bytes(op.send, op.count)
		if err != nil {
			return nil, err
		}
		out[op.root] = b
		if op.root == me {
			mine = op
		}
	}
	if mine == nil {
		return nil, nil
	}
	recv, err := bytes(mine.recv, mine.count)
	if err != nil {
		return nil, err
	}
	for p := range n {
		want[p] = mine.count * es
	}
	return func(in [][]byte) error {
		copy(recv, collective.ReduceBytes(dt, in, first.red))
		return nil
	}, nil
}

// planP2P plans grouped sends and receives (see plan).
func (c *fakeComm) planP2P(ops []fakeOp, out [][]byte, want []int, bytes resolver) (func(in [][]byte) error, error) {
	n := c.g.Size()
	// At most one send and one receive per peer: a member's own
	// segment goes through too.
	recvs := make([][]byte, n)
	for _, op := range ops {
		if op.peer < 0 || op.peer >= n {
			return nil, fmt.Errorf("fake nccl: peer %d of %d", op.peer, n)
		}
		side, addr := out, op.send
		if op.kind == "recv" {
			side, addr = recvs, op.recv
		}
		if side[op.peer] != nil {
			return nil, fmt.Errorf("fake nccl: two %ss with peer %d in one group", op.kind, op.peer)
		}
		b, err := bytes(addr, op.count)
		if err != nil {
			return nil, err
		}
		if b == nil {
			b = []byte{}
		}
		side[op.peer] = b
		if op.kind == "recv" {
			want[op.peer] = len(b)
		}
	}
	return func(in [][]byte) error {
		for p, b := range recvs {
			copy(b, in[p])
		}
		return nil
	}, nil
}

func (c *fakeComm) AllReduce(send, recv uintptr, count int, dt tensor.DType, op collective.ReduceOp) error {
	return c.enqueue("ncclAllReduce", fakeOp{kind: "all_reduce", send: send, recv: recv, count: count, dt: dt, red: op})
}

func (c *fakeComm) AllGather(send, recv uintptr, count int, dt tensor.DType) error {
	return c.enqueue("ncclAllGather", fakeOp{kind: "all_gather", send: send, recv: recv, count: count, dt: dt})
}

func (c *fakeComm) ReduceScatter(send, recv uintptr, count int, dt tensor.DType, op collective.ReduceOp) error {
	return c.enqueue("ncclReduceScatter", fakeOp{kind: "reduce_scatter", send: send, recv: recv, count: count, dt: dt, red: op})
}

func (c *fakeComm) Broadcast(send, recv uintptr, count int, dt tensor.DType, root int) error {
	return c.enqueue("ncclBroadcast", fakeOp{kind: "broadcast", send: send, recv: recv, count: count, dt: dt, root: root})
}

func (c *fakeComm) Reduce(send, recv uintptr, count int, dt tensor.DType, op collective.ReduceOp, root int) error {
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
	first := !c.aborted
	if first {
		c.aborted = true
		close(c.abort)
	}
	c.mu.Unlock()
	if first {
		if a := c.f.o.Aborted; a != nil {
			a.Add(1)
		}
		if f := c.f.o.OnAbort; f != nil {
			f(c.f.w.Rank())
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

// Backend is the nccl backend for tensors of devices of kind dev over the
// fake library, for a World's Options.Backends.
func Backend(dev tensor.DeviceKind, o Options) collective.DeviceBackend {
	return collective.NCCLBackend(dev, New(o))
}
