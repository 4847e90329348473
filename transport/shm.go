package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/meshrun/meshrun/collective"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// The shm transport: ranks on one host exchange bytes through single-producer,
// single-consumer byte rings in shared memory, one per ordered pair of ranks,
// as NCCL and MPI do within a node. A ring is a file under /dev/shm mapped with
// mmap by both processes; the producer advances head, the consumer tail (64-bit
// atomics in a control page), and a waiting side sleeps on a futex in the same
// page (bounded to a few milliseconds so that deadlines, aborts and peer death
// are noticed) after yielding its core a while (see defaultSpin). The
// consumer unlinks the file as soon as both ends have mapped it, so nothing
// is left in /dev/shm even if a process is killed.
//
// Frames are the 80-byte Header followed by the payload; the consumer reads the
// payload straight from the ring into the caller's buffer (one copy each side).

type shmTransport struct {
	probe      *uint64 // a word peers read to check single copy
	rank, size int
	out, in    []*shmRing
	arena      *arena       // this rank's (nil: none)
	arenaRing  *shmRing     // the file holding it
	arenas     []*shmRing   // the peers', mapped here
	arenaMu    sync.RWMutex // read-held while a collective reads the peers' arenas; Close unmaps them under the write lock
	aborted    []atomic.Pointer[error]
	closeOnce  sync.Once
	spin       int // ShmOptions.Spin, the default applied
}

// ShmAvailable reports whether this host can hold the shm transport's rings
// (a writable shared-memory directory).
func ShmAvailable() bool {
	st, err := os.Stat(shmDir)
	return err == nil && st.IsDir() && unix.Access(shmDir, unix.W_OK) == nil
}

// ShmOptions configure the shm transport (bootstrap.EnvConfig reads them
// from MESHRUN_SHM_SPIN, MESHRUN_SHM_SINGLE_COPY and MESHRUN_SHM_ARENA).
type ShmOptions struct {
	// Logger logs the ring names found taken; nil logs nothing.
	Logger *zap.Logger
	// Spin is how many times a waiter yields its core before it sleeps on
	// the futex (see defaultSpin); 0: the default; negative: none.
	Spin int
	// SingleCopy turns on the cross-memory-attach path for large payloads
	// (see cmaMin); it is off by default.
	SingleCopy bool
	// ArenaBytes is the size of each rank's shared-memory arena, rounded up
	// to whole pages (see arena.go); 0: the default, 1 GiB of address
	// space; negative: no arena.
	ArenaBytes int
}

// spin is o's Spin with the default applied.
func (o ShmOptions) spin() int {
	switch {
	case o.Spin < 0:
		return 0
	case o.Spin == 0:
		return defaultSpin
	}
	return o.Spin
}

// NewShmTransport maps the rings between rank and every other rank of a job
// whose ranks all run on this host; the roster holds every rank's ring token.
// o configures it.
func NewShmTransport(ctx context.Context, rank, size int, roster *collective.Roster, o ShmOptions) (collective.Transport, error) {
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	if roster == nil || len(roster.Ranks) != size {
		return nil, &collective.Error{Kind: collective.ErrInvalid, Rank: -1, Reporter: rank, Detail: "shm setup: no roster of the job's ranks"}
	}
	names, err := newShmNames(roster, rank)
	if err != nil {
		return nil, err
	}
	t := &shmTransport{spin: o.spin(), rank: rank, size: size, out: make([]*shmRing, size), in: make([]*shmRing, size), aborted: make([]atomic.Pointer[error], size)}
	t.probe = new(uint64)
	*t.probe = shmMagic ^ uint64(os.Getpid())
	// Rings are brought in up front while every ring of the job together
	// stays within shmPrefaultMax (8 ranks on a host); beyond, pages come as
	// messages first reach them.
	prefault := int64(size)*int64(size-1)*(shmCtrl+shmCapacity) <= shmPrefaultMax
	fail := func(peer int, err error) (collective.Transport, error) {
		t.unmapAll()
		var e *collective.Error
		if errors.As(err, &e) {
			e.Reporter = rank
			return nil, e
		}
		return nil, &collective.Error{Kind: collective.ErrPeerLost, Rank: peer, Reporter: rank, Detail: "shm setup: " + err.Error()}
	}
	for p := 0; p < size; p++ {
		if p == rank {
			continue
		}
		r, err := createRing(names, rank, p, log, prefault, shmCapacity)
		if err != nil {
			return fail(p, err)
		}
		r.peer, r.out = p, true
		atomic.StoreUint64(r.u64(offProbe), uint64(uintptr(unsafe.Pointer(t.probe))))
		t.out[p] = r
	}
	asize := arenaSize(o.ArenaBytes)
	if asize > 0 {
		// The arena is the "ring" from this rank to itself (see arena.go).
		r, err := createRing(names, rank, rank, log, false, asize)
		if err != nil {
			return fail(rank, err)
		}
		t.arenaRing, t.arena = r, newArena(r.data)
		t.arenas = make([]*shmRing, size)
	}
	for p := 0; p < size; p++ {
		if p == rank {
			continue
		}
		r, err := openRing(ctx, names, p, rank, prefault, shmCapacity, true)
		if err != nil {
			return fail(p, err)
		}
		if asize > 0 {
			// Before we mark the peer's ring opened (below): once it sees
			// that, we have mapped its arena, and it unlinks it.
			a, err := openRing(ctx, names, p, p, false, asize, false)
			if err != nil {
				syscall.Munmap(r.mem)
				return fail(p, err)
			}
			t.arenas[p] = a
		}
		r.peer = p
		r.pid = int(atomic.LoadUint32(r.u32(offProdPID)))
		// Can we read the producer's memory? (Same user, no ptrace restriction.)
		var word uint64
		addr := uintptr(atomic.LoadUint64(r.u64(offProbe)))
		n, err := unix.ProcessVMReadv(r.pid, []unix.Iovec{{Base: (*byte)(unsafe.Pointer(&word)), Len: 8}},
			[]unix.RemoteIovec{{Base: addr, Len: 8}}, 0)
		r.cma = err == nil && n == 8 && word == shmMagic^uint64(r.pid) && o.SingleCopy
		if r.cma {
			atomic.StoreUint32(r.u32(offCMA), 1)
		} else {
			atomic.StoreUint32(r.u32(offCMA), 2)
		}
		t.in[p] = r
	}
	// Wait until every peer has opened (and probed) our rings: both ends of a
	// link then agree on single copy before the first byte.
	for p := 0; p < size; p++ {
		r := t.out[p]
		if r == nil {
			continue
		}
		for atomic.LoadUint32(r.u32(offCMA)) == 0 {
			select {
			case <-ctx.Done():
				return fail(p, fmt.Errorf("rank %d never opened its ring: %w", p, ctx.Err()))
			case <-time.After(2 * time.Millisecond):
			}
		}
		r.cma = atomic.LoadUint32(r.u32(offCMA)) == 1
		r.pid = int(atomic.LoadUint32(r.u32(offConsPID)))
	}
	if t.arenaRing != nil {
		t.arenaRing.unlink() // every peer has it mapped
	}
	return t, nil
}

// Arena is this rank's own arena (collective.ArenaTransport), nil without one.
func (t *shmTransport) Arena() collective.Arena {
	if t.arena == nil {
		return nil
	}
	return t.arena
}

func (t *shmTransport) ReadArenas() func() {
	t.arenaMu.RLock()
	return t.arenaMu.RUnlock
}

func (t *shmTransport) PeerArena(rank int) []byte {
	if t.arenas == nil || rank < 0 || rank >= len(t.arenas) || t.arenas[rank] == nil {
		return nil
	}
	return t.arenas[rank].data
}

// sendCMA publishes a descriptor of p and waits until the consumer has copied it.
func (t *shmTransport) sendCMA(dl collective.Deadline, r *shmRing, p []byte) error {
	binary.LittleEndian.PutUint64(r.desc[0:], uint64(uintptr(unsafe.Pointer(&p[0]))))
	binary.LittleEndian.PutUint64(r.desc[8:], uint64(len(p)))
	if err := t.write(dl, r, r.hb[:], r.desc[:]); err != nil {
		return err
	}
	r.acks++
	spins := 0
	for {
		seen := atomic.LoadUint32(r.u32(offAckSeq))
		if int32(seen-r.acks) >= 0 {
			runtime.KeepAlive(p)
			return nil
		}
		if checkNow(spins, t.spin) {
			if err := t.check(dl, r, "sending"); err != nil {
				return err
			}
		}
		wait(r.u32(offAckSeq), r.u32(offAckWait), seen, &spins, t.spin)
	}
}

// recvCMA copies the producer's buffer described in the ring into dst.
func (t *shmTransport) recvCMA(dl collective.Deadline, r *shmRing, dst []byte) error {
	if err := t.read(dl, r, r.desc[:]); err != nil {
		return err
	}
	addr := uintptr(binary.LittleEndian.Uint64(r.desc[0:]))
	if n := binary.LittleEndian.Uint64(r.desc[8:]); n != uint64(len(dst)) {
		return &collective.Error{Kind: collective.ErrCorrupt, Rank: r.peer, Reporter: t.rank, Detail: fmt.Sprintf("single-copy descriptor of %d bytes for %d", n, len(dst))}
	}
	for off := 0; off < len(dst); {
		n, err := unix.ProcessVMReadv(r.pid, []unix.Iovec{{Base: &dst[off], Len: uint64(len(dst) - off)}},
			[]unix.RemoteIovec{{Base: addr + uintptr(off), Len: len(dst) - off}}, 0)
		if err != nil {
			if errors.Is(err, syscall.ESRCH) {
				return &collective.Error{Kind: collective.ErrPeerLost, Rank: r.peer, Reporter: t.rank, Detail: "receiving: process is gone"}
			}
			return &collective.Error{Kind: collective.ErrPeerLost, Rank: r.peer, Reporter: t.rank, Detail: "receiving: single copy: " + err.Error()}
		}
		if n <= 0 {
			return &collective.Error{Kind: collective.ErrPeerLost, Rank: r.peer, Reporter: t.rank, Detail: "receiving: single copy made no progress"}
		}
		off += n
	}
	atomic.AddUint32(r.u32(offAckSeq), 1)
	if atomic.LoadUint32(r.u32(offAckWait)) != 0 {
		futexWake(r.u32(offAckSeq))
	}
	return nil
}

func (t *shmTransport) Name() string  { return "shm" }
func (t *shmTransport) Rank() int     { return t.rank }
func (t *shmTransport) Size() int     { return t.size }
func (t *shmTransport) MaxChunk() int { return collective.MaxPayload }

// ready returns why r, a ring with peer held under its mu, cannot carry a
// message: the transport closed it, or peer was aborted; nil if it can.
func (t *shmTransport) ready(r *shmRing, peer int) error {
	if r.mem == nil {
		return errClosedTransport
	}
	if e := t.aborted[peer].Load(); e != nil {
		return *e
	}
	return nil
}

func (t *shmTransport) Send(dl collective.Deadline, peer int, h *collective.Header, p []byte) error {
	r := t.out[peer]
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := t.ready(r, peer); err != nil {
		return err
	}
	h.Length = uint32(len(p))
	h.Encode(r.hb[:])
	if r.cma && len(p) >= cmaMin {
		return t.sendCMA(dl, r, p)
	}
	return t.write(dl, r, r.hb[:], p)
}

// TrySend writes the message only if the ring has room for all of it now.
func (t *shmTransport) TrySend(peer int, h *collective.Header, p []byte) (bool, error) {
	r := t.out[peer]
	if r.cma && len(p) >= cmaMin {
		return false, nil
	}
	if !r.mu.TryLock() {
		return false, nil
	}
	defer r.mu.Unlock()
	if err := t.ready(r, peer); err != nil {
		return false, err
	}
	head := atomic.LoadUint64(r.u64(offHead))
	need := uint64(collective.HeaderSize + len(p))
	if r.cap-(head-r.seen) < need {
		r.seen = atomic.LoadUint64(r.u64(offTail))
		if r.cap-(head-r.seen) < need {
			return false, nil
		}
	}
	h.Length = uint32(len(p))
	h.Encode(r.hb[:])
	for _, part := range [2][]byte{r.hb[:], p} {
		for len(part) > 0 {
			pos := head % r.cap
			n := min(uint64(len(part)), r.cap-pos)
			copy(r.data[pos:pos+n], part[:n])
			head += n
			part = part[n:]
		}
	}
	t.publish(r, head)
	return true, nil
}

func (t *shmTransport) Recv(dl collective.Deadline, peer int, want *collective.Header, dst []byte) error {
	r := t.in[peer]
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := t.ready(r, peer); err != nil {
		return err
	}
	if err := t.read(dl, r, r.hb[:]); err != nil {
		return err
	}
	got, err := collective.DecodeHeader(r.hb[:], collective.MaxPayload)
	if err != nil {
		return err
	}
	if err := collective.CheckHeader(want, &got); err != nil {
		return err
	}
	if r.cma && len(dst) >= cmaMin {
		return t.recvCMA(dl, r, dst)
	}
	return t.read(dl, r, dst)
}

func (t *shmTransport) Abort(peers []int, err error) {
	for _, p := range peers {
		if p >= 0 && p < t.size && p != t.rank {
			t.aborted[p].CompareAndSwap(nil, &err)
			for _, r := range []*shmRing{t.out[p], t.in[p]} {
				if r == nil {
					continue
				}
				r.mmu.RLock()
				if r.mem != nil {
					futexWake(r.u32(offHead))
					futexWake(r.u32(offTail))
					futexWake(r.u32(offAckSeq))
				}
				r.mmu.RUnlock()
			}
		}
	}
}

func (t *shmTransport) unmapAll() {
	// The peers' arenas are unmapped once no collective reads them (Close
	// aborts pending waits first); this rank's own stays mapped (the
	// program may still hold buffers from it) and goes with the process.
	t.arenaMu.Lock()
	for _, r := range t.arenas {
		if r != nil && r.mem != nil {
			syscall.Munmap(r.mem)
			r.mem, r.data = nil, nil
		}
	}
	t.arenaMu.Unlock()
	if t.arenaRing != nil {
		t.arenaRing.unlink() // if setup failed before every peer had it
	}
	for _, rs := range [][]*shmRing{t.out, t.in} {
		for _, r := range rs {
			if r == nil {
				continue
			}
			r.mu.Lock() // waits for a pending Send/Recv (aborted first)
			if r.out {
				// If the consumer never mapped it; while it is mapped here,
				// the file's inode cannot be another's.
				r.unlink()
			}
			r.mmu.Lock()
			if r.mem != nil {
				if r.out {
					atomic.StoreUint32(r.u32(offProdDone), 1)
				} else {
					atomic.StoreUint32(r.u32(offConsDone), 1)
				}
				futexWake(r.u32(offHead))
				futexWake(r.u32(offTail))
				syscall.Munmap(r.mem)
				r.mem, r.data = nil, nil
			}
			r.mmu.Unlock()
			r.mu.Unlock()
		}
	}
}

func (t *shmTransport) Close() error {
	t.closeOnce.Do(func() {
		all := make([]int, 0, t.size)
		for p := 0; p < t.size; p++ {
			all = append(all, p)
		}
		t.Abort(all, errClosedTransport)
		t.unmapAll()
	})
	return nil
}
