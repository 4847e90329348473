package collective

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/meshrun/meshrun/tensor"
)

// Float is the element types collectives move. Reductions of bfloat16 add in
// float32 and round once per hop (see reduceInto).
type Float interface {
	~float32 | ~float64 | tensor.BF16
}

func dtypeOf[T Float]() tensor.DType {
	var z T
	switch unsafe.Sizeof(z) {
	case 2:
		return tensor.BFloat16
	case 4:
		return tensor.Float32
	}
	return tensor.Float64
}

func asBytes[T Float](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

func asElems[T Float](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

// Group runs collectives among a fixed group of ranks on host memory, over the
// World's Transport: the host algorithms, and the coordination every backend
// keeps (see Communicator). Calls on one Group are serialized; every member must
// make the same calls in the same order (that order is checked: sequence numbers
// are in every header).
type Group struct {
	w     *World
	ranks []int
	me    int
	key   string
	id    uint64
	// lib: the group is a device library's own (the fake NCCL's). Its
	// calls run inside a collective of the rank's, which the heartbeats
	// report and whose failure names the group; they leave the World's
	// state (the collective in flight, the sequence numbers) alone, and
	// their errors fail the World as the transport reported them.
	lib bool

	mu      sync.Mutex // one collective at a time
	sendMu  sync.Mutex // one Send at a time
	recvMu  sync.Mutex // one Recv at a time
	seq     uint64
	p2pSend []uint64
	p2pRecv []uint64
	scratch []byte
	idx     []int
	algo    string
	o       opState

	sq       chan sendReq
	sh       Header // the sender goroutine's header
	sd       chan error
	stopOnce sync.Once
	quit     chan struct{}
	wg       sync.WaitGroup
}

type sendReq struct {
	dl   Deadline
	peer int
	h    Header
	p    []byte
}

const sendQueue = 1024

func newComm(w *World, ranks []int, me int, key string, id uint64) *Group {
	c := &Group{w: w, ranks: ranks, me: me, key: key, id: id,
		p2pSend: make([]uint64, len(ranks)), p2pRecv: make([]uint64, len(ranks)),
		sq: make(chan sendReq, sendQueue), sd: make(chan error, sendQueue), quit: make(chan struct{})}
	c.wg.Add(1)
	go c.sender()
	return c
}

func (c *Group) sender() {
	defer c.wg.Done()
	for {
		select {
		case <-c.quit:
			return
		case r := <-c.sq:
			c.sh = r.h // a header owned by the sender goroutine: no allocation per send
			err := c.w.t.Send(r.dl, r.peer, &c.sh, r.p)
			if err != nil {
				c.w.fail(toError(err, r.peer, c.w.rank))
			}
			c.sd <- err
		}
	}
}

func (c *Group) stop() {
	c.stopOnce.Do(func() { close(c.quit) })
	c.wg.Wait()
}

// Size is the number of ranks in the group.
func (c *Group) Size() int { return len(c.ranks) }

// Index is this rank's position in the group.
func (c *Group) Index() int { return c.me }

// Ranks returns the group's world ranks, in group order.
func (c *Group) Ranks() []int { return append([]int(nil), c.ranks...) }

// String names the group, e.g. "[0 2]".
func (c *Group) String() string { return c.key }

// World returns the World the communicator belongs to.
func (c *Group) World() *World { return c.w }

// opState is one collective in flight.
type opState struct {
	c *Group
	// dl bounds every Send and Recv of the collective: the World's failure
	// (which a caller's cancellation also causes) ends it early, its
	// deadline with ErrTimeout. It allocates nothing.
	dl    Deadline
	stop  func() bool // stops the watch of the caller's ctx
	want  Header      // the header Recv expects (kept here: no allocation)
	sh    Header      // the header of a synchronous (p2p) send
	h     Header
	esize int
	nsent int
	ndone int
	err   error
	start time.Time
	p2p   *sync.Mutex // Send/Recv: held instead of mu; sends are synchronous
	// release, if set, is called when the op ends (the arena algorithms'
	// hold on the peers' arenas).
	release func()
}

func toError(err error, peer, reporter int) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Kind: ErrPeerLost, Rank: peer, Reporter: reporter, Detail: err.Error()}
}

// begin starts a collective: checks the World, takes the next sequence number,
// records the state for heartbeats, sets the deadline.
func (c *Group) begin(ctx context.Context, op Op, dt tensor.DType, red ReduceOp, count int, shape uint64) (*opState, error) {
	return c.beginOn(ctx, &c.mu, &c.o, op, dt, red, count, shape)
}

func (c *Group) beginP2P(ctx context.Context, lock *sync.Mutex, dt tensor.DType, count int) (*opState, error) {
	o, err := c.beginOn(ctx, lock, new(opState), OpSend, dt, 0, count, 0)
	if o != nil {
		o.p2p = lock
	}
	return o, err
}

func (c *Group) beginOn(ctx context.Context, lock *sync.Mutex, o *opState, op Op, dt tensor.DType, red ReduceOp, count int, shape uint64) (*opState, error) {
	lock.Lock()
	w := c.w
	w.mu.Lock()
	if w.err != nil || w.closed {
		err := error(w.err)
		if w.err == nil {
			err = &Error{Kind: ErrClosed, Rank: -1, Reporter: w.rank, Detail: "world closed"}
		}
		w.mu.Unlock()
		lock.Unlock()
		return nil, err
	}
	for _, r := range c.ranks {
		if w.gone[r] {
			w.mu.Unlock()
			lock.Unlock()
			return nil, &Error{Kind: ErrPeerLost, Rank: r, Reporter: w.rank, Group: c.key, Op: op.String(), Detail: "the peer closed its world"}
		}
	}
	var seq uint64
	now := time.Now()
	if op != OpSend {
		c.seq++
		seq = c.seq
		if !c.lib {
			w.seqs[c.key] = seq
			w.cur = State{Group: c.key, Ranks: c.ranks, Seq: seq, Op: op.String(), Active: true, Since: now}
		}
	}
	w.mu.Unlock()
	*o = opState{c: c, esize: max(1, dt.Size()), start: now}
	o.dl = Deadline{At: now.Add(w.opts.DataTimeout), Done: w.ctx.Done(), cause: w.ctx}
	if ctx.Done() != nil { // a cancelable caller: its cancellation fails the World
		o.stop = context.AfterFunc(ctx, func() {
			w.fail(&Error{Kind: ErrAborted, Rank: w.rank, Reporter: w.rank, Group: c.key, Seq: seq, Op: op.String(),
				Detail: "caller canceled: " + fmt.Sprint(context.Cause(ctx))})
		})
	}
	o.h = Header{Op: op, DType: dt, RedOp: uint8(red), Job: w.job, Group: c.id, Seq: seq, Count: uint64(count), Shape: shape}
	return o, nil
}

// end finishes a collective: waits for its sends, turns errors into the World's
// failure, updates the state.
func (c *Group) end(o *opState, err error) error {
	if o.release != nil {
		o.release() // the algorithm is done reading; failWith may close the transport
		o.release = nil
	}
	if err != nil {
		c.failWith(o, err)
	}
	if e := o.drain(); e != nil && err == nil {
		err = e
		c.failWith(o, err)
	}
	if o.stop != nil {
		o.stop()
	}
	w := c.w
	w.mu.Lock()
	if o.p2p == nil && !c.lib {
		w.cur.Active = false
		w.cur.Since = time.Now()
	}
	first := w.err
	w.mu.Unlock()
	if o.p2p != nil {
		o.p2p.Unlock()
	} else {
		c.mu.Unlock()
	}
	if err != nil && first != nil {
		return first
	}
	return err
}

func (c *Group) failWith(o *opState, err error) {
	cp := *toError(err, -1, c.w.rank) // errors may be shared: never modify one in place
	e := &cp
	if c.lib { // the collective the library works for names itself
		c.w.fail(e)
		return
	}
	if e.Group == "" && !errors.Is(e, ErrAborted) && !errors.Is(e, ErrClosed) && !errors.Is(e, ErrControlLost) {
		e.Group, e.Seq, e.Op = c.key, o.h.Seq, o.h.Op.String()
	}
	if errors.Is(e, ErrTimeout) && e.Want == "" {
		if r, why := c.w.blame(c.key, o.h.Seq, c.ranks, e.Rank); r >= 0 {
			if r != e.Rank || why != "" {
				e.Rank = r
				e.Detail = fmt.Sprintf("waited %v: %s", time.Since(o.start).Round(time.Millisecond), why)
			}
		}
	}
	c.w.fail(e)
	if errors.Is(e, ErrMismatch) { // the culprit is being decided: wait for it
		t := time.NewTimer(2 * mismatchGrace)
		select {
		case <-c.w.ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// send queues a message to group member peer; it returns the send's index.
func (o *opState) send(peer int, step, chunk uint32, off int, p []byte) int {
	h := o.h
	h.Src, h.Dst = int32(o.c.w.rank), int32(o.c.ranks[peer])
	h.Step, h.Chunk, h.Offset, h.Length = step, chunk, uint64(off), uint32(len(p))
	if o.p2p != nil {
		o.sh = h
		if err := o.c.w.t.Send(o.dl, o.c.ranks[peer], &o.sh, p); err != nil && o.err == nil {
			o.err = err
		}
		o.nsent++
		o.ndone++
		return o.nsent - 1
	}
	if o.nsent == o.ndone { // nothing queued: a send that fits goes out inline
		if ts, ok := o.c.w.t.(TrySender); ok {
			o.sh = h
			sent, err := ts.TrySend(o.c.ranks[peer], &o.sh, p)
			if sent || err != nil {
				if err != nil && o.err == nil {
					o.err = err
				}
				o.nsent++
				o.ndone++
				return o.nsent - 1
			}
		}
	}
	if o.nsent-o.ndone >= sendQueue {
		o.waitSent(o.nsent - sendQueue)
	}
	o.c.sq <- sendReq{dl: o.dl, peer: o.c.ranks[peer], h: h, p: p}
	o.nsent++
	return o.nsent - 1
}

// TrySender is a Transport that can send without blocking when the message
// fits (shm: room in the ring), which saves the handoff to the sender
// goroutine. Collective asks a Transport for it with a type assertion.
type TrySender interface {
	// TrySend sends h and p to peer if it can without waiting; it reports
	// whether it did. An error fails the send as Send's would.
	TrySend(peer int, h *Header, p []byte) (bool, error)
}

// waitSent waits until send i (and every earlier one) has completed.
func (o *opState) waitSent(i int) error {
	for o.ndone <= i {
		var e error
		select {
		case e = <-o.c.sd:
		case <-o.c.quit: // sender stopped by Close: nothing more will be sent
			select {
			case e = <-o.c.sd:
			default:
				e = &Error{Kind: ErrClosed, Rank: -1, Reporter: o.c.w.rank, Detail: "world closed"}
			}
		}
		if e != nil && o.err == nil {
			o.err = e
		}
		o.ndone++
	}
	return o.err
}

func (o *opState) drain() error { return o.waitSent(o.nsent - 1) }

// recv receives the next message from group member peer into dst.
func (o *opState) recv(peer int, step, chunk uint32, off int, dst []byte) error {
	want := &o.want
	*want = o.h
	want.Src, want.Dst = int32(o.c.ranks[peer]), int32(o.c.w.rank)
	want.Step, want.Chunk, want.Offset, want.Length = step, chunk, uint64(off), uint32(len(dst))
	return o.c.w.t.Recv(o.dl, o.c.ranks[peer], want, dst)
}

// chunkElems is the pipelining unit in elements.
func (o *opState) chunkElems() int {
	b := o.c.w.opts.ChunkBytes
	if b <= 0 {
		b = tuningOf(o.c.w.t.Name()).chunk
	}
	b = min(b, o.c.w.t.MaxChunk())
	return max(1, b/o.esize)
}

func (o *opState) small(bytes int) bool { return bytes <= o.c.w.opts.SmallBytes }

// scratch returns n bytes of the communicator's reusable scratch.
func (c *Group) scratchBytes(n int) []byte {
	if cap(c.scratch) < n {
		c.scratch = make([]byte, n)
	}
	return c.scratch[:n]
}

func nchunks(n, ce int) int {
	if n <= 0 {
		return 1
	}
	return (n + ce - 1) / ce
}

// create is the group-creation handshake: a barrier whose headers carry the
// group's ranks, so members that disagree fail.
func (c *Group) create(ctx context.Context) error {
	o, err := c.begin(ctx, OpCreate, dnone, 0, len(c.ranks), hash64("ranks", c.ranks))
	if err != nil {
		return err
	}
	return c.end(o, dissemination(o))
}

// Barrier returns once every member has entered it.
func (c *Group) Barrier(ctx context.Context) error {
	o, err := c.begin(ctx, OpBarrier, dnone, 0, 0, 0)
	if err != nil {
		return err
	}
	return c.end(o, dissemination(o))
}

// dissemination barrier: ceil(log2 n) rounds of empty messages.
func dissemination(o *opState) error {
	n, k := len(o.c.ranks), o.c.me
	step := uint32(0)
	for d := 1; d < n; d *= 2 {
		o.send((k+d)%n, step, 0, 0, nil)
		if err := o.recv((k-d+n)%n, step, 0, 0, nil); err != nil {
			return err
		}
		step++
	}
	return nil
}

// tuning is what the algorithms choose by transport, measured with
// bench/collective on a 2-core host (docs/collective.md, "Benchmark"):
//
//   - chunk: the ring's pipelining unit. Over tcp, 2 MiB chunks moved
//     0.81x raw loopback TCP on average over all-reduce and all-gather of 4
//     to 64 MiB on 2 and 4 ranks, against 0.66x with 256 KiB (fewer
//     syscalls and wakeups per byte; 4 MiB measured the same as 2). On shm
//     the 4 MiB rings pipeline best in 256 KiB.
//   - arena, arenaGather: the smallest all-reduce, and all-gather or
//     reduce-scatter, that asks whether every buffer lies in its
//     shared-memory arena (shm only, see arenaalgo.go).
type tuning struct {
	chunk       int
	arena       int
	arenaGather int
}

var tunings = map[string]tuning{
	"shm": {chunk: 256 << 10, arena: arenaMin, arenaGather: arenaGatherMin},
	"tcp": {chunk: 2 << 20},
}

// tuningOf returns the tuning of the named transport (shm's numbers for
// one without its own).
func tuningOf(name string) tuning {
	if t, ok := tunings[name]; ok {
		return t
	}
	return tunings["shm"]
}
