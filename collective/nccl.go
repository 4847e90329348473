package collective

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/meshrun/meshrun/tensor"
)

// NCCL is the function table of an NCCL library as the nccl backend calls it:
// the real one (libnccl.so.2, loaded at run time by package collective/nccl in
// cuda builds) or package ncclfake's, the same calls over the transport, which
// the test suite runs without a GPU. Buffers are device addresses (a tensor
// buffer's Addr) and counts are in elements, as in NCCL's C API.
//
// Every call but Name, and every call of its communicators, is made with the
// device's context current on the calling OS thread: inside the Run of the
// communicator's memory (the cuda Memory's makes the provider's primary
// context current on a locked thread), the context current at InitRank for
// every later call on that communicator, as NCCL needs. The backend makes
// them so; the library relies on it (the fake checks it). The work runs on
// the memory's stream (its Stream method), the one the kernels run on.
type NCCL interface {
	// Name says which library this is, with its version.
	Name() string
	// UniqueID is ncclGetUniqueId: the token a communicator's first rank makes
	// and the others receive (over NATS, see Control.Offer).
	UniqueID() ([]byte, error)
	// InitRank is ncclCommInitRank: joins the communicator of n ranks named by
	// id as rank, on the device of mem; it returns once all n have joined.
	// Two ranks on one device are refused (ncclInvalidUsage).
	InitRank(mem tensor.Memory, n int, id []byte, rank int) (NCCLComm, error)
}

// NCCLComm is one NCCL communicator. The collective and point-to-point calls
// enqueue work and return; Query says when it has completed. The calls f
// makes inside Grouped are issued as one (between ncclGroupStart and
// ncclGroupEnd, on one thread): grouped sends and receives cannot deadlock on
// their order. The backend makes one call at a time.
type NCCLComm interface {
	AllReduce(send, recv uintptr, count int, dt tensor.DType, op ReduceOp) error
	AllGather(send, recv uintptr, sendCount int, dt tensor.DType) error
	ReduceScatter(send, recv uintptr, recvCount int, dt tensor.DType, op ReduceOp) error
	Broadcast(send, recv uintptr, count int, dt tensor.DType, root int) error
	Reduce(send, recv uintptr, count int, dt tensor.DType, op ReduceOp, root int) error
	Send(buf uintptr, count int, dt tensor.DType, peer int) error
	Recv(buf uintptr, count int, dt tensor.DType, peer int) error
	Grouped(f func() error) error
	// Query reports whether all enqueued work has completed, or the
	// communicator's asynchronous error (ncclCommGetAsyncError).
	Query() (done bool, err error)
	// Abort is ncclCommAbort: the communicator ends now, work in flight
	// included, and every peer's pending work fails.
	Abort() error
	// Destroy is ncclCommDestroy, once the work has completed.
	Destroy() error
}

// NCCLBackend is the nccl device backend for tensors of kind, over the
// library open returns for a World (open may load it once per process; an
// error means it is not there, and auto falls back to staged collectives
// saying why).
//
// Every collective keeps the Group's coordination: the members first exchange
// its descriptor over the Group's transport (sequence number, op, dtype,
// counts; all-to-all's counts pair by pair), so a mismatch fails every rank
// with both descriptors before NCCL sees it; then the library runs it, and the
// rank waits for it under the collective's deadline, watching the World. A
// deadline passed, a library error or a failure anywhere in the job (a notice
// over NATS, a peer lost) aborts the communicator (ncclCommAbort): no rank is
// left waiting on a GPU, and each fails with the typed error naming the
// culprit. The unique id travels over the control plane (NATS), from the
// group's first member to the others. Every library call runs inside the
// memory's Run (see NCCL): the communicator's creation on a goroutine of its
// own and the abort of an idle communicator when the World fails included.
func NCCLBackend(kind tensor.DeviceKind, open func(w *World) (NCCL, error)) DeviceBackend {
	return &ncclBackend{kind: kind, open: open}
}

type ncclBackend struct {
	kind tensor.DeviceKind
	open func(w *World) (NCCL, error)
}

func (b *ncclBackend) Name() string                  { return BackendNCCL }
func (b *ncclBackend) Serves(dev tensor.Device) bool { return dev.Kind == b.kind }

// Probe opens the library: an error wrapping ErrNoLibrary if it cannot.
func (b *ncclBackend) Probe(w *World) error {
	if _, err := b.open(w); err != nil {
		return fmt.Errorf("%w: %v", ErrNoLibrary, err)
	}
	return nil
}

func (b *ncclBackend) New(ctx context.Context, g *Group, mem tensor.Memory) (Communicator, error) {
	w := g.w
	lib, err := b.open(w)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoLibrary, err)
	}
	c := &ncclComm{g: g, dev: mem.Device(), mem: mem, lib: lib}
	name := fmt.Sprintf("nccl-id %s %v", g.key, c.dev.Kind)
	if g.me == 0 {
		err = c.do(func() error {
			var err error
			c.id, err = lib.UniqueID()
			return err
		})
		if err == nil {
			err = w.ctrl.Offer(name, c.id)
		}
		if err != nil {
			return nil, c.fail(&Error{Kind: ErrLibrary, Rank: w.rank, Reporter: w.rank, Group: g.key, Op: "nccl_init", Detail: err.Error()})
		}
	} else {
		actx, cancel := context.WithTimeoutCause(w.ctx, w.opts.DataTimeout, context.DeadlineExceeded)
		stop := context.AfterFunc(ctx, cancel)
		c.id, err = w.ctrl.Ask(actx, name)
		stop()
		cancel()
		if err != nil {
			if werr := w.Err(); werr != nil {
				return nil, werr
			}
			return nil, c.fail(&Error{Kind: ErrTimeout, Rank: g.ranks[0], Reporter: w.rank, Group: g.key, Op: "nccl_init",
				Detail: "the communicator's unique id never came from its first member: " + err.Error()})
		}
	}
	context.AfterFunc(w.ctx, c.abortIdle)
	w.OnClose(c.destroy)
	return c, nil
}

// ncclComm is the nccl backend's Communicator for one group.
type ncclComm struct {
	g   *Group
	dev tensor.Device
	mem tensor.Memory // the device whose context the library's calls run in
	lib NCCL
	id  []byte

	mu   sync.Mutex
	comm NCCLComm // made by the first collective
	dead error    // set when the communicator was aborted or destroyed
	algo string
	// late counts the goroutines waiting for an init that gave up (the
	// World failed or its deadline passed) to abort the communicator the
	// library may still return; destroy waits for them, a while.
	late sync.WaitGroup
}

// lateAbortWait bounds how long World.Close waits for a late init's
// communicator to be aborted: an init stuck on a peer that died may never
// return.
const lateAbortWait = 2 * time.Second

func (c *ncclComm) Backend() string       { return BackendNCCL }
func (c *ncclComm) Device() tensor.Device { return c.dev }
func (c *ncclComm) Ranks() []int          { return c.g.Ranks() }
func (c *ncclComm) Index() int            { return c.g.Index() }

func (c *ncclComm) Algorithm() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.algo
}

// Barrier is the Group's: no device work to order.
func (c *ncclComm) Barrier(ctx context.Context) error { return c.g.Barrier(ctx) }

func (c *ncclComm) fail(e *Error) error {
	c.g.w.fail(e)
	return e
}

// runner is device memory that runs a library's calls with the device's
// context current on a locked OS thread (kernels/cuda's, kernels/sim's).
type runner interface{ Run(f func() error) error }

// do makes library calls: inside the memory's Run, so that the context the
// communicator was created in is current (NCCL's calls on a communicator
// need it, nvidia/nccl#565), on one OS thread (a group of calls between
// ncclGroupStart and ncclGroupEnd belongs to its thread). Memory without Run
// (no contexts) calls f as it is.
func (c *ncclComm) do(f func() error) error {
	if r, ok := c.mem.(runner); ok {
		return r.Run(f)
	}
	return f()
}

// addressed is a device buffer with an address (cuda's, sim's).
type addressed interface{ Addr() uintptr }

// at returns the device address of element off of t.
func at(t *tensor.Tensor, off int) uintptr {
	return t.Buffer().(addressed).Addr() + uintptr(off*t.DType().Size())
}

// args checks the tensors (this communicator's device, one dtype, addressed).
func (c *ncclComm) args(ts ...*tensor.Tensor) (tensor.DType, error) {
	dt, err := sameDevice(c.dev, ts...)
	if err != nil {
		return 0, err
	}
	for _, t := range ts {
		if _, ok := t.Buffer().(addressed); !ok {
			return 0, fmt.Errorf("%w: %v has no device address", ErrInvalid, t)
		}
	}
	return dt, nil
}

// ncclCall is one collective as the backend runs it.
type ncclCall struct {
	op    Op
	dt    tensor.DType
	red   ReduceOp
	count int
	shape uint64
	// check exchanges the descriptor (nil: a dissemination barrier whose
	// headers carry it).
	check func(o *opState) error
	algo  string
	issue func(nc NCCLComm) error
	// keep are the tensors whose addresses the calls hold: alive until the
	// work has completed.
	keep []*tensor.Tensor
}

// run runs one collective: the descriptor check on the Group, the library's
// calls, the wait for them.
func (c *ncclComm) run(ctx context.Context, k ncclCall) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	o, err := c.g.begin(ctx, k.op, k.dt, k.red, k.count, k.shape)
	if err != nil {
		return err
	}
	if k.check == nil {
		k.check = dissemination
	}
	err = k.check(o)
	if err == nil {
		err = o.drain()
	}
	if err == nil {
		err = c.init(o)
	}
	if err == nil {
		c.algo = "nccl/" + k.algo
		if err = c.do(func() error { return k.issue(c.comm) }); err != nil {
			c.abortLocked()
			err = &Error{Kind: ErrLibrary, Rank: c.g.w.rank, Reporter: c.g.w.rank, Detail: err.Error()}
		} else {
			err = c.wait(o)
		}
	}
	runtime.KeepAlive(k.keep)
	return c.g.end(o, err)
}

// init makes the NCCL communicator on first use: every member has passed
// the descriptor check, so all of them are joining. ncclCommInitRank blocks
// until they have: it runs on a goroutine, inside the memory's Run.
func (c *ncclComm) init(o *opState) error {
	if c.dead != nil {
		return c.dead
	}
	if c.comm != nil {
		return nil
	}
	type made struct {
		nc  NCCLComm
		err error
	}
	ch := make(chan made, 1)
	go func() {
		var m made
		m.err = c.do(func() error {
			m.nc, m.err = c.lib.InitRank(c.mem, c.g.Size(), c.id, c.g.me)
			return m.err
		})
		ch <- m
	}()
	t := time.NewTimer(time.Until(o.dl.At))
	defer t.Stop()
	var why error
	select {
	case m := <-ch:
		if m.err != nil {
			return &Error{Kind: ErrLibrary, Rank: c.g.w.rank, Reporter: c.g.w.rank, Detail: "ncclCommInitRank: " + m.err.Error()}
		}
		c.comm = m.nc
		return nil
	case <-o.dl.Done:
		if why = c.g.w.Err(); why == nil {
			why = &Error{Kind: ErrAborted, Rank: -1, Reporter: c.g.w.rank, Detail: "world closed"}
		}
	case <-t.C:
		why = &Error{Kind: ErrTimeout, Rank: -1, Reporter: c.g.w.rank, Detail: "ncclCommInitRank did not complete"}
	}
	c.late.Add(1)
	go func() { // the library may still return a communicator: end it
		defer c.late.Done()
		if m := <-ch; m.nc != nil {
			c.do(m.nc.Abort)
		}
	}()
	c.dead = why
	return why
}

// wait polls the library until the work completes; the deadline, a library
// error or the World's failure abort the communicator.
func (c *ncclComm) wait(o *opState) error {
	for i := 0; ; i++ {
		var done bool
		err := c.do(func() error {
			var err error
			done, err = c.comm.Query()
			return err
		})
		if err != nil { // the library failed here: this rank is the culprit
			c.abortLocked()
			return &Error{Kind: ErrLibrary, Rank: c.g.w.rank, Reporter: c.g.w.rank, Detail: err.Error()}
		}
		if done {
			return nil
		}
		if o.dl.Expired() {
			c.abortLocked()
			if werr := c.g.w.Err(); werr != nil {
				return werr
			}
			return &Error{Kind: ErrTimeout, Rank: -1, Reporter: c.g.w.rank,
				Detail: fmt.Sprintf("%s: the work did not complete in %v; communicator aborted", c.lib.Name(), time.Since(o.start).Round(time.Millisecond))}
		}
		if i < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(time.Duration(min(i-63, 50)) * 10 * time.Microsecond)
		}
	}
}

func (c *ncclComm) abortLocked() {
	if c.comm != nil {
		c.do(c.comm.Abort)
		c.comm = nil
	}
	if c.dead == nil {
		c.dead = &Error{Kind: ErrAborted, Rank: -1, Reporter: c.g.w.rank, Group: c.g.key, Detail: "nccl communicator aborted"}
	}
}

// abortIdle runs when the World's context ends: where the World failed (a
// notice over NATS, a peer lost, a mismatch), an idle communicator is
// aborted here (a collective in flight aborts it itself); a World closed
// healthy leaves its communicators to destroy, which Close runs.
func (c *ncclComm) abortIdle() {
	if c.g.w.Err() == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.abortLocked()
}

// destroy ends a healthy communicator at World.Close, after an init that
// gave up has aborted what the library returned it late (lateAbortWait at
// most), so that no call of the library outlives the World.
func (c *ncclComm) destroy() error {
	done := make(chan struct{})
	go func() { c.late.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(lateAbortWait):
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	if c.comm != nil {
		err = c.do(c.comm.Destroy)
		c.comm = nil
	}
	if c.dead == nil {
		c.dead = &Error{Kind: ErrClosed, Rank: -1, Reporter: c.g.w.rank, Group: c.g.key, Detail: "world closed"}
	}
	return err
}

// even reports whether all counts are equal.
func even(counts []int) bool {
	for _, n := range counts {
		if n != counts[0] {
			return false
		}
	}
	return true
}

func (c *ncclComm) AllReduce(ctx context.Context, buf *tensor.Tensor, op ReduceOp) error {
	dt, err := c.args(buf)
	if err != nil {
		return err
	}
	if err := checkOp(op); err != nil {
		return err
	}
	n := buf.Len()
	return c.run(ctx, ncclCall{op: OpAllReduce, dt: dt, red: op, count: n, keep: []*tensor.Tensor{buf}, algo: "all_reduce",
		issue: func(nc NCCLComm) error { return nc.AllReduce(at(buf, 0), at(buf, 0), n, dt, op) }})
}

func (c *ncclComm) Broadcast(ctx context.Context, buf *tensor.Tensor, root int) error {
	dt, err := c.args(buf)
	if err != nil {
		return err
	}
	if root < 0 || root >= c.g.Size() {
		return invalid("broadcast: root %d outside group of %d", root, c.g.Size())
	}
	n := buf.Len()
	return c.run(ctx, ncclCall{op: OpBroadcast, dt: dt, count: n, shape: hashCounts(root, nil), keep: []*tensor.Tensor{buf}, algo: "broadcast",
		issue: func(nc NCCLComm) error { return nc.Broadcast(at(buf, 0), at(buf, 0), n, dt, root) }})
}

// segments checks per-member counts against the member's and the whole
// buffer's lengths; it returns the offsets.
func (c *ncclComm) segments(op string, counts []int, mine, whole *tensor.Tensor) ([]int, error) {
	if len(counts) != c.g.Size() {
		return nil, invalid("%s: %d counts for a group of %d", op, len(counts), c.g.Size())
	}
	offs, total, err := offsets(counts)
	if err != nil {
		return nil, err
	}
	if mine.Len() != counts[c.g.me] || whole.Len() != total {
		return nil, invalid("%s: this member's buffer has %d elements (count %d), the whole %d (total %d)", op, mine.Len(), counts[c.g.me], whole.Len(), total)
	}
	return offs, nil
}

// AllGather: ncclAllGather for even counts; uneven ones (balanced shards of
// a length the group does not divide) as grouped sends and receives, each
// member's segment to every other, nothing padded.
func (c *ncclComm) AllGather(ctx context.Context, in, out *tensor.Tensor, counts []int) error {
	dt, err := c.args(in, out)
	if err != nil {
		return err
	}
	offs, err := c.segments("all_gather", counts, in, out)
	if err != nil {
		return err
	}
	k := ncclCall{op: OpAllGather, dt: dt, count: offs[len(counts)], shape: hashCounts(-1, counts), keep: []*tensor.Tensor{in, out}}
	me := c.g.me
	if even(counts) {
		k.algo, k.issue = "all_gather", func(nc NCCLComm) error { return nc.AllGather(at(in, 0), at(out, 0), counts[me], dt) }
	} else {
		k.algo, k.issue = "grouped send/recv", func(nc NCCLComm) error {
			return nc.Grouped(func() error {
				for j := range counts {
					if err := p2p(nc, at(in, 0), counts[me], at(out, offs[j]), counts[j], dt, j); err != nil {
						return err
					}
				}
				return nil
			})
		}
	}
	return c.run(ctx, k)
}

// ReduceScatter: ncclReduceScatter for even counts; uneven ones as one
// ncclReduce per member, rooted at it, grouped.
func (c *ncclComm) ReduceScatter(ctx context.Context, in, out *tensor.Tensor, counts []int, op ReduceOp) error {
	dt, err := c.args(in, out)
	if err != nil {
		return err
	}
	if err := checkOp(op); err != nil {
		return err
	}
	offs, err := c.segments("reduce_scatter", counts, out, in)
	if err != nil {
		return err
	}
	k := ncclCall{op: OpReduceScatter, dt: dt, red: op, count: offs[len(counts)], shape: hashCounts(-1, counts), keep: []*tensor.Tensor{in, out}}
	me := c.g.me
	if even(counts) {
		k.algo, k.issue = "reduce_scatter", func(nc NCCLComm) error { return nc.ReduceScatter(at(in, 0), at(out, 0), counts[me], dt, op) }
	} else {
		k.algo, k.issue = "grouped reduce", func(nc NCCLComm) error {
			return nc.Grouped(func() error {
				for j, n := range counts {
					if n == 0 {
						continue
					}
					recv := at(in, offs[j]) // only the root's receive buffer is written
					if j == me {
						recv = at(out, 0)
					}
					if err := nc.Reduce(at(in, offs[j]), recv, n, dt, op, j); err != nil {
						return err
					}
				}
				return nil
			})
		}
	}
	return c.run(ctx, k)
}

// AllToAll: grouped sends and receives. The check sends every peer a header
// with the count this member sends it, and expects the count it receives, so
// a pair that disagrees fails with both counts before NCCL runs.
func (c *ncclComm) AllToAll(ctx context.Context, send *tensor.Tensor, sendCounts []int, recv *tensor.Tensor, recvCounts []int) error {
	dt, err := c.args(send, recv)
	if err != nil {
		return err
	}
	n, me := c.g.Size(), c.g.me
	so, ro, err := allToAllCounts(n, me, sendCounts, recvCounts, send.Len(), recv.Len())
	if err != nil {
		return err
	}
	return c.run(ctx, ncclCall{op: OpAllToAll, dt: dt, keep: []*tensor.Tensor{send, recv}, algo: "grouped send/recv",
		check: func(o *opState) error {
			for i := 1; i < n; i++ {
				p := (me + i) % n
				o.h.Count = uint64(sendCounts[p])
				o.send(p, 0, 0, 0, nil)
			}
			for i := 1; i < n; i++ {
				p := (me - i + n) % n
				o.h.Count = uint64(recvCounts[p])
				if err := o.recv(p, 0, 0, 0, nil); err != nil {
					return err
				}
			}
			return nil
		},
		issue: func(nc NCCLComm) error {
			return nc.Grouped(func() error {
				for j := range n {
					if err := p2p(nc, at(send, so[j]), sendCounts[j], at(recv, ro[j]), recvCounts[j], dt, j); err != nil {
						return err
					}
				}
				return nil
			})
		}})
}

// p2p queues a send of sn elements and a receive of rn with peer (either
// skipped when empty; a member's own segment goes through NCCL too).
func p2p(nc NCCLComm, send uintptr, sn int, recv uintptr, rn int, dt tensor.DType, peer int) error {
	if sn > 0 {
		if err := nc.Send(send, sn, dt, peer); err != nil {
			return err
		}
	}
	if rn > 0 {
		return nc.Recv(recv, rn, dt, peer)
	}
	return nil
}
