// Package collective moves tensors between the ranks of a meshrun job: all-reduce,
// all-gather and reduce-scatter with per-rank counts, all-to-all, broadcast,
// barrier and send/recv per group of ranks (the world, or any list of ranks:
// package redistribute runs placement plans over the groups of a mesh).
//
// Two layers. A Group runs the algorithms (ring, direct, chain, pairwise) on host
// memory over the World's Transport. A Communicator takes tensors of one device
// and is chosen per buffer device: "host" (a Group on host tensors), "staged"
// (device buffers copied to host memory in chunks, pipelined with a Group's
// collectives, and back) or "nccl" (where Options.Backends lists it: builds
// that have it). Every backend keeps the Group's coordination, so failures
// look the same on every device.
//
// The data plane is a Transport (local here; shm, tcp and nats in package
// transport); the coordination plane (rendezvous, heartbeats, failure notices,
// abort) is a Control, over NATS in a real job (see package bootstrap). Every
// message carries a fixed binary Header that the receiver checks before using
// a byte. Every wait has a deadline.
//
// Failure model: the first failure anywhere is fatal to the World. The rank that
// detects it publishes a Notice; every rank's pending and future calls fail with
// that first error (a *Error wrapping ErrPeerLost, ErrMismatch, ErrTimeout,
// ErrAborted or ErrControlLost, naming the culprit rank). Nothing is retried.
package collective

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/meshrun/meshrun/protocol"
	"github.com/meshrun/meshrun/tensor"
	"go.uber.org/zap"
)

// ReduceOp is the reduction a collective applies: Sum, Avg, Max, Min (the
// type placement's partial tensors name too).
type ReduceOp = tensor.ReduceOp

// The reductions.
const (
	Sum = tensor.Sum
	Avg = tensor.Avg
	Max = tensor.Max
	Min = tensor.Min
)

// Options tune a World. Zero values mean the defaults.
type Options struct {
	// Job is the job id; its hash is in every header.
	Job string
	// DataTimeout bounds one collective call; default 60 s.
	DataTimeout time.Duration
	// ChunkBytes is the pipelining unit of large collectives; default the
	// transport's (tuning: 256 KiB on shm, 2 MiB on tcp), capped by its
	// MaxChunk.
	ChunkBytes int
	// SmallBytes: collectives of at most this many bytes use direct algorithms
	// (one message to every peer) instead of rings; default 32 KiB.
	SmallBytes int
	// Collectives chooses the backend of device buffers: "auto" (default),
	// "host", "staged" or "nccl" (see Communicator).
	Collectives string
	// Backends are the device backends this World may use, the first that
	// serves a device first (none: device buffers are staged). A worker
	// lists what its build and settings have (package job: nccl in cuda
	// builds, the fake library on sim devices when chosen); tests give the
	// nccl backend over package ncclfake this way.
	Backends []DeviceBackend
	// StageBytes is the staged backend's pipelining unit: device buffers cross
	// to host memory in chunks of this size; default 4 MiB.
	StageBytes int
	// Logger; nil logs nothing.
	Logger *zap.Logger
}

func (o *Options) defaults() {
	if o.DataTimeout <= 0 {
		o.DataTimeout = 60 * time.Second
	}
	if o.SmallBytes <= 0 {
		o.SmallBytes = 32 << 10
	}
	if o.Collectives == "" {
		o.Collectives = BackendAuto
	}
	if o.StageBytes <= 0 {
		o.StageBytes = 4 << 20
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
}

// World is one rank's membership in a job: its transport, control plane and
// communicators.
type World struct {
	rank, size int
	t          Transport
	ctrl       Control
	opts       Options
	job        uint64
	log        *zap.Logger

	ctx    context.Context // canceled with the first failure as cause
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	err     *Error
	comms   map[string]*Group
	dcomms  map[commKey]Communicator
	seqs    map[string]uint64
	cur     State
	closers []func() error
	closed  bool
	gone    map[int]bool // ranks that closed their World
	votes   map[string]map[int]string
	voteOn  string

	// parent and view: a view's World and the world ranks of its ranks
	// (View); nil on a World.
	parent *World
	view   []int
}

// NewWorld builds a World over a transport and a control plane (bootstrap.Join
// does this for a real job; tests pair LocalTransports with LocalControls).
func NewWorld(t Transport, ctrl Control, o Options) (*World, error) {
	o.defaults()
	if t == nil || ctrl == nil {
		return nil, fmt.Errorf("%w: nil transport or control", ErrInvalid)
	}
	var err error
	if o.Collectives, err = ParseBackend(o.Collectives); err != nil {
		return nil, err
	}
	w := &World{rank: t.Rank(), size: t.Size(), t: t, ctrl: ctrl, opts: o, job: JobHash(o.Job),
		log: o.Logger, comms: map[string]*Group{}, seqs: map[string]uint64{}}
	w.ctx, w.cancel = context.WithCancelCause(context.Background())
	w.cur = State{Rank: w.rank, Since: time.Now()}
	ctrl.Attach(w.State, w.onNotice)
	return w, nil
}

// Rank is this process's rank in the job.
func (w *World) Rank() int { return w.rank }

// Size is the number of ranks in the job.
func (w *World) Size() int { return w.size }

// Transport returns the data plane in use.
func (w *World) Transport() Transport { return w.t }

// Control returns the coordination plane in use.
func (w *World) Control() Control { return w.ctrl }

// Err returns the World's first failure, or nil.
func (w *World) Err() error {
	if w.parent != nil {
		return w.parent.Err()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		return nil
	}
	return w.err
}

// State reports what this rank is doing (heartbeats carry it).
func (w *World) State() State {
	if w.parent != nil {
		return w.parent.State()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.cur
	s.Rank = w.rank
	s.Time = time.Now()
	s.Seqs = make(map[string]uint64, len(w.seqs))
	for k, v := range w.seqs {
		s.Seqs[k] = v
	}
	if w.err != nil {
		n := noticeOf(w.err)
		s.Failure = &n
	}
	return s
}

func (w *World) onNotice(n Notice) {
	if n.Code == protocol.CodePeerClosed {
		w.peerClosed(n.Rank)
		return
	}
	w.failLocal(noticeErr(n), false)
}

// peerClosed: rank closed its World. A collective in flight with it fails; so
// does any later one whose group holds it.
func (w *World) peerClosed(rank int) {
	w.mu.Lock()
	if w.gone == nil {
		w.gone = map[int]bool{}
	}
	w.gone[rank] = true
	active := w.cur.Active && slices.Contains(w.cur.Ranks, rank)
	w.mu.Unlock()
	if active {
		w.fail(&Error{Kind: ErrPeerLost, Rank: rank, Reporter: w.rank, Detail: "the peer closed its world during the collective"})
	}
}

// fail records the World's first failure, publishes it to the job, and aborts
// every link so pending calls return.
//
// A lost peer seen by this rank's transport (a closed connection, a vanished
// process) may be the echo of an earlier failure elsewhere: a rank that failed
// first publishes its notice and then closes its connections. So before
// blaming the peer, wait briefly for such a notice; the first failure wins and
// every rank names the same culprit.
func (w *World) fail(e *Error) {
	if errors.Is(e, ErrPeerLost) {
		t := time.NewTimer(peerLostGrace)
		select {
		case <-w.ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	w.failLocal(e, true)
}

// peerLostGrace is how long a transport-detected peer loss waits for an
// earlier failure's notice.
const peerLostGrace = 250 * time.Millisecond

func (w *World) failLocal(e *Error, publish bool) {
	w.mu.Lock()
	if w.err != nil || w.closed {
		w.mu.Unlock()
		return
	}
	if e.Reporter < 0 && publish {
		cp := *e
		cp.Reporter = w.rank
		e = &cp
	}
	if e.Group == "" && w.cur.Active && !errors.Is(e, ErrAborted) {
		// A loss seen by the heartbeats: name the collective it interrupted here.
		cp := *e
		cp.Group, cp.Seq, cp.Op = w.cur.Group, w.cur.Seq, w.cur.Op
		e = &cp
	}
	if errors.Is(e, ErrMismatch) && e.Want != "" && e.Got != "" && e.Group != "" {
		w.vote(e)
		w.mu.Unlock()
		if publish {
			n := noticeOf(e)
			n.Decided = false
			_ = w.ctrl.Publish(n)
		}
		return
	}
	w.mu.Unlock()
	w.settle(e, publish)
}

// settle makes e the World's failure: cancels pending calls, tells the job
// (publish), aborts every link.
func (w *World) settle(e *Error, publish bool) {
	w.mu.Lock()
	if w.err != nil || w.closed {
		w.mu.Unlock()
		return
	}
	w.err = e
	w.mu.Unlock()
	w.log.Warn("collective failed", zap.Error(e))
	w.cancel(e)
	if publish {
		n := noticeOf(e)
		if errors.Is(e, ErrAborted) && e.Group == "" {
			n.Abort = true
		}
		_ = w.ctrl.Publish(n)
	}
	all := make([]int, 0, w.size)
	for r := 0; r < w.size; r++ {
		if r != w.rank {
			all = append(all, r)
		}
	}
	w.t.Abort(all, e)
}

// mismatchGrace is how long mismatch reports are gathered before the culprit
// is decided.
const mismatchGrace = 200 * time.Millisecond

// vote records a mismatch report (the reporter's descriptor against the
// sender's) and, on the first one, decides the culprit mismatchGrace later:
// the rank whose descriptor the fewest ranks share. In a ring the rank that
// called something else is reported by its successor and reports its
// predecessor, so with three or more ranks it stands alone; with two (or an
// even split) the higher rank is named and the detail says so. Every rank
// gathers the same reports, so every rank names the same culprit. Caller
// holds w.mu.
func (w *World) vote(e *Error) {
	key := fmt.Sprintf("%s#%d", e.Group, e.Seq)
	if w.votes == nil {
		w.votes = map[string]map[int]string{}
	}
	v := w.votes[key]
	if v == nil {
		v = map[int]string{}
		w.votes[key] = v
	}
	if e.Reporter >= 0 {
		v[e.Reporter] = e.Want
	}
	if e.Rank >= 0 {
		v[e.Rank] = e.Got
	}
	if w.voteOn != "" {
		return
	}
	w.voteOn = key
	base := *e
	time.AfterFunc(mismatchGrace, func() {
		w.mu.Lock()
		votes := w.votes[key]
		count := map[string]int{}
		for _, d := range votes {
			count[d]++
		}
		culprit, majority := -1, ""
		for r, d := range votes {
			if culprit < 0 || count[d] < count[votes[culprit]] || count[d] == count[votes[culprit]] && r > culprit {
				culprit = r
			}
		}
		ref := -1
		for r, d := range votes {
			if d != votes[culprit] && (ref < 0 || count[d] > count[majority] || count[d] == count[majority] && r < ref) {
				ref, majority = r, d
			}
		}
		// Read everything the decision needs while holding the lock: later
		// reports keep writing this map.
		got := votes[culprit]
		tie := count[got] == count[majority]
		w.mu.Unlock()
		final := base
		final.Rank, final.Reporter, final.Got, final.Want = culprit, ref, got, majority
		if op, _, ok := strings.Cut(majority, " "); ok {
			op, _, _ = strings.Cut(op, "(")
			final.Op = op
		}
		if tie {
			final.Detail = fmt.Sprintf("ranks %d and %d disagree and no majority tells which is wrong: naming the higher", ref, culprit)
		}
		w.settle(&final, false)
		if ref == w.rank { // one rank tells the job (and the launcher) the decision
			_ = w.ctrl.Publish(noticeOf(&final))
		}
	})
}

// Fail makes the World fail with err (a *Error or any error, wrapped as
// ErrAborted), as if a collective had failed: the job is told.
func (w *World) Fail(err error) {
	if w.parent != nil {
		w.parent.Fail(err)
		return
	}
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Kind: ErrAborted, Rank: w.rank, Reporter: w.rank, Detail: err.Error()}
	}
	w.fail(e)
}

// silentAfter: a peer whose last heartbeat is older than this is called
// silent in a timeout's blame (heartbeats come every 500 ms by default).
const silentAfter = 2 * time.Second

// blame picks the culprit of a timeout in group key at seq (see culprit);
// fallback when it finds none. It stops asking once the World has failed
// (the failure another rank published wins, and this blame would be
// dropped): when every member reaches the deadline at once, each would
// otherwise ask up to every member in turn, N² requests in all.
func (w *World) blame(key string, seq uint64, ranks []int, fallback int) (int, string) {
	peer := func(r int) (State, time.Time, bool) {
		if w.ctx.Err() != nil {
			return State{}, time.Time{}, false
		}
		return w.ctrl.PeerState(r)
	}
	if r, why := culprit(w.rank, key, seq, ranks, peer, time.Now()); r >= 0 && w.ctx.Err() == nil {
		return r, why
	}
	return fallback, ""
}

// culprit reads the peers' last heartbeats (peer) and names the member of
// group key (ranks) that the collective seq waited for, -1 if none:
//
//  1. a member that never entered it and is heard, outside any collective
//     (stuck computing, or in a collective of another group);
//  2. a member that never entered it and was not heard for silentAfter, or
//     never (its state asked twice): unreachable, stopped or dead. After 1:
//     under load a heartbeat comes late and a state request can go
//     unanswered (at 256 ranks every member that reached the deadline asks
//     every other), while a member just heard outside the collective
//     certainly never entered it;
//  3. a member that never entered it because it still waits in an earlier
//     collective is itself blocked: the member of that collective's group
//     that went silent is named in its place (a host whose link went down
//     stalls its neighbours' collective first), else that member.
func culprit(me int, key string, seq uint64, ranks []int, peer func(int) (State, time.Time, bool), now time.Time) (int, string) {
	type missing struct {
		r   int
		st  State
		ago time.Duration
	}
	type quiet struct {
		r   int
		why string
	}
	var alive []missing
	var silentOnes []quiet
	op := func(st State) string { return fmt.Sprintf("%s seq %d of group %s", st.Op, st.Seq, st.Group) }
	where := func(st State) string {
		if st.Op == "" {
			return "outside any collective"
		}
		return "in " + op(st)
	}
	silent := func(r int) (time.Duration, State, bool) {
		st, at, ok := peer(r)
		if !ok {
			return 0, st, true
		}
		ago := now.Sub(at).Round(time.Millisecond)
		return ago, st, ago > silentAfter
	}
	for _, r := range ranks {
		if r == me {
			continue
		}
		st, at, ok := peer(r)
		if !ok {
			st, at, ok = peer(r)
		}
		if !ok {
			silentOnes = append(silentOnes, quiet{r, "never entered it; no heartbeat ever heard"})
			continue
		}
		if st.Seqs[key] >= seq {
			continue
		}
		ago := now.Sub(at).Round(time.Millisecond)
		if ago > silentAfter {
			silentOnes = append(silentOnes, quiet{r, fmt.Sprintf("never entered it; nothing heard from it for %v (unreachable, stopped or dead; last seen %s)", ago, where(st))})
			continue
		}
		alive = append(alive, missing{r, st, ago})
	}
	for _, m := range alive {
		if !m.st.Active {
			return m.r, fmt.Sprintf("never entered it (last seen %s, %v ago)", where(m.st), m.ago)
		}
	}
	if len(silentOnes) > 0 {
		return silentOnes[0].r, silentOnes[0].why
	}
	for _, m := range alive {
		for _, r := range m.st.Ranks {
			if r == me || r == m.r {
				continue
			}
			if ago, st, gone := silent(r); gone {
				heard := "no heartbeat ever heard"
				if ago > 0 {
					heard = fmt.Sprintf("nothing heard from it for %v (unreachable, stopped or dead; last seen %s)", ago, where(st))
				}
				return r, fmt.Sprintf("rank %d never entered it, still waiting in %s; %s", m.r, op(m.st), heard)
			}
		}
	}
	if len(alive) > 0 {
		m := alive[0]
		return m.r, fmt.Sprintf("never entered it (last seen %s, %v ago)", where(m.st), m.ago)
	}
	return -1, ""
}

// Comm returns the communicator of the group ranks (world ranks, in group
// order), creating it on first use. Every member must call Comm with the same
// ranks; creation is a handshake among them that fails on disagreement.
func (w *World) Group(ctx context.Context, ranks []int) (*Group, error) {
	return w.root().group(ctx, w.global(ranks), "", false)
}

// group is Group for the group of ranks told apart by tag from others of the
// same ranks. A lib group is a device library's own (the fake NCCL's
// communicators): its calls are the library's work inside a collective of
// the rank's, not collectives of their own (see Group.lib).
func (w *World) group(ctx context.Context, ranks []int, tag string, lib bool) (*Group, error) {
	key := tag + fmt.Sprint(ranks)
	w.mu.Lock()
	if c, ok := w.comms[key]; ok {
		w.mu.Unlock()
		return c, nil
	}
	if w.closed {
		w.mu.Unlock()
		return nil, ErrClosed
	}
	me := slices.Index(ranks, w.rank)
	if me < 0 {
		w.mu.Unlock()
		return nil, fmt.Errorf("%w: rank %d is not in group %v", ErrInvalid, w.rank, ranks)
	}
	seen := map[int]bool{}
	for _, r := range ranks {
		if r < 0 || r >= w.size || seen[r] {
			w.mu.Unlock()
			return nil, fmt.Errorf("%w: group %v: bad or repeated rank %d (world %d)", ErrInvalid, ranks, r, w.size)
		}
		seen[r] = true
	}
	c := newComm(w, slices.Clone(ranks), me, key, hash64("group:"+tag, ranks))
	c.lib = lib
	w.comms[key] = c
	w.mu.Unlock()
	if err := c.create(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// WorldComm is the communicator of all ranks.
func (w *World) WorldGroup(ctx context.Context) (*Group, error) {
	r := make([]int, w.Size())
	for i := range r {
		r[i] = i
	}
	return w.Group(ctx, r)
}

// OnClose registers f to run at Close (after the communicators stop).
func (w *World) OnClose(f func() error) {
	if w.parent != nil {
		w.parent.OnClose(f)
		return
	}
	w.mu.Lock()
	w.closers = append(w.closers, f)
	w.mu.Unlock()
}

// Close stops the communicators and releases the transport and control plane.
// Pending calls fail with ErrClosed.
func (w *World) Close() error {
	if w.parent != nil {
		return nil
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	comms := make([]*Group, 0, len(w.comms))
	for _, c := range w.comms {
		comms = append(comms, c)
	}
	closers := w.closers
	w.mu.Unlock()
	closedErr := &Error{Kind: ErrClosed, Rank: -1, Reporter: w.rank, Detail: "world closed"}
	w.cancel(closedErr)
	all := make([]int, 0, w.size)
	for r := 0; r < w.size; r++ {
		if r != w.rank {
			all = append(all, r)
		}
	}
	w.t.Abort(all, closedErr)
	for _, c := range comms {
		c.stop()
	}
	errs := []error{w.ctrl.Close(), w.t.Close()}
	for i := len(closers) - 1; i >= 0; i-- {
		errs = append(errs, closers[i]())
	}
	return errors.Join(errs...)
}
