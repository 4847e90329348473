package transport

import (
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
	"golang.org/x/sys/unix"
)

const (
	shmMagic    = 0x4d52534831 // "MRSH1"
	shmCtrl     = 4096
	shmCapacity = 4 << 20 // ring bytes per ordered pair
	// shmPrefaultMax bounds the ring memory a job brings in at setup (see
	// populate), all its ranks' rings together: 8 ranks on a host.
	shmPrefaultMax = 256 << 20
)

// shmDir holds the rings (tests point it elsewhere).
var shmDir = "/dev/shm"

// control page offsets (each hot word on its own cache line). A message
// moves two lines between the cores: the producer's store to head and the
// consumer's to tail; the producer reads tail only when the space it last
// saw runs out, and each side's wait flag is written only when it goes to
// sleep. The futex words are head's and tail's low 32 bits (they move on
// every publish, by less than 2³² while a waiter sleeps: the ring is
// smaller).
const (
	offMagic     = 0
	offHead      = 64  // producer; its low word is the data futex
	offTail      = 128 // consumer; its low word is the space futex
	offDataWait  = 192 // consumer: 1 while it sleeps on head
	offSpaceWait = 256 // producer: 1 while it sleeps on tail
	offProdPID   = 320
	offConsPID   = 324
	offProdDone  = 328
	offConsDone  = 332
	offProbe     = 384 // producer: address of its probe word (single-copy check)
	offCMA       = 392 // consumer: 1 if it can read the producer's memory
	offAckSeq    = 448 // consumer: single-copy reads completed (low 32 bits)
	offAckWait   = 452
	// offToken (512) holds the producer's ring token: see shmNames.
)

// Payloads of at least cmaMin bytes travel by single copy where the kernel
// allows it (cross-memory attach, process_vm_readv): the producer writes only
// the header and a descriptor (address, length) of its buffer, the consumer
// copies straight from the producer's memory into its own buffer and bumps the
// ack counter, and the producer's Send returns once that ack arrives. Setup
// probes it per link; where it is refused, bytes go through the ring.
//
// It is off unless ShmOptions.SingleCopy (MESHRUN_SHM_SINGLE_COPY=1): on this project's 2-core test
// machine it measured slower than the ring (the producer's wait for each ack
// stalls the pipeline, worst with more ranks than cores).
const cmaMin = 32 << 10

// defaultSpin is how many times a waiter yields its core to other processes
// (sched_yield) before it sleeps on the futex; ShmOptions.Spin
// (MESHRUN_SHM_SPIN) overrides it. Yielding rather than spinning in place
// keeps ranks that outnumber the cores moving: on 2 cores, 256 yields halved
// 4-rank latencies against a futex sleep after a short in-process spin.
const defaultSpin = 256

type shmRing struct {
	mem  []byte
	data []byte
	cap  uint64
	path string
	peer int
	out  bool   // we produce
	cma  bool   // single copy on this link
	pid  int    // the peer's pid
	acks uint32 // producer: single-copy sends so far
	desc [16]byte
	mu   sync.Mutex   // one Send or Recv at a time
	mmu  sync.RWMutex // mem lifetime: Abort wakes under RLock, unmap under Lock
	hb   [collective.HeaderSize]byte
	dead int64 // unix nanos of the last liveness check
	// dev, ino: the file this process created or opened at path; unlink
	// removes path only while it is still that file.
	dev, ino uint64
	// seen: the producer's last read of tail, the consumer's of head
	// (each side reloads the other's word only when this one runs out).
	seen uint64
}

// unlink removes the ring's name if the file there is still the ring: once
// unlinked, the name is anyone's, and a file another process has made there
// since is not this job's to remove.
func (r *shmRing) unlink() {
	var st unix.Stat_t
	if r.path == "" || unix.Lstat(r.path, &st) != nil || st.Dev != r.dev || st.Ino != r.ino {
		return
	}
	os.Remove(r.path)
}

func (r *shmRing) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }
func (r *shmRing) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), 0 /* FUTEX_WAIT, shared */, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), 1 /* FUTEX_WAKE, shared */, 1<<30, 0, 0, 0)
}

// populate brings a ring's data into this process before the first
// message: the producer writes every byte (the pages allocated and mapped
// writable), the consumer reads every cache line. Left to the first pass of
// messages, the ring costs a page fault per page on both sides in the middle
// of collectives: on this project's VM a 4 KiB all-reduce took 40-90 us over
// 2 ranks and 380-440 us over 4 for its first thousand calls (one page per
// call), against 2 and 27 us once the ring had wrapped. Mapping the pages
// alone (madvise MADV_POPULATE_WRITE and _READ) left the first pass over 4
// ranks at 90-170 us a call; touching every line leaves it at 28 us. It is
// done before the ring is published, so nothing reads it yet.
func populate(b []byte, write bool) {
	if write {
		clear(b)
		return
	}
	var sink byte
	for i := 0; i < len(b); i += 64 {
		sink += b[i]
	}
	runtime.KeepAlive(sink)
}

func initRing(f *os.File, token []byte, prefault bool, capacity int) (*shmRing, error) {
	if err := f.Truncate(int64(shmCtrl + capacity)); err != nil {
		return nil, err
	}
	// The pages written at setup are allocated first: where the shared
	// memory is full (any local user can fill /dev/shm) that is an error
	// here, not a SIGBUS at the first write.
	reserve := int64(shmCtrl)
	if prefault {
		reserve += int64(capacity)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, reserve); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		return nil, fmt.Errorf("reserving %d bytes: %w", reserve, err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, shmCtrl+capacity, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	r := &shmRing{mem: mem, data: mem[shmCtrl:], cap: uint64(capacity), path: f.Name()}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		syscall.Munmap(mem)
		return nil, err
	}
	r.dev, r.ino = st.Dev, st.Ino
	if prefault {
		populate(r.data, true)
	}
	atomic.StoreUint32(r.u32(offProdPID), uint32(os.Getpid()))
	copy(mem[offToken:offToken+ShmTokenBytes], token)
	atomic.StoreUint64(r.u64(offMagic), shmMagic) // last: the consumer reads nothing before it
	return r, nil
}

// check returns an error if the wait must end: abort, deadline, peer gone.
func (t *shmTransport) check(dl collective.Deadline, r *shmRing, what string) error {
	if e := t.aborted[r.peer].Load(); e != nil {
		return *e
	}
	if dl.Expired() {
		return dl.Err(r.peer, what)
	}
	now := time.Now().UnixNano()
	if now-r.dead > int64(20*time.Millisecond) {
		r.dead = now
		done, pid := offConsDone, offConsPID
		if !r.out {
			done, pid = offProdDone, offProdPID
		}
		if atomic.LoadUint32(r.u32(done)) != 0 {
			return &collective.Error{Kind: collective.ErrPeerLost, Rank: r.peer, Reporter: t.rank, Detail: what + ": peer closed its transport"}
		}
		if p := atomic.LoadUint32(r.u32(pid)); p != 0 {
			if err := syscall.Kill(int(p), 0); errors.Is(err, syscall.ESRCH) {
				return &collective.Error{Kind: collective.ErrPeerLost, Rank: r.peer, Reporter: t.rank, Detail: fmt.Sprintf("%s: process %d is gone", what, p)}
			}
		}
	}
	return nil
}

// checkNow says whether a waiter looks for an abort, its deadline and its
// peer (check) before its next wait: every 16th time while it spins and
// yields, and every time once it sleeps on the futex. An abort wakes the
// futex once; a waiter that went back to sleep for 15 more rounds of up to
// 2 ms before it looked took up to 30 ms to see it (a survivor of a job
// torn down after one rank's SIGTERM exited 20-40 ms after it over shm,
// 1-2 ms over tcp).
func checkNow(spins, limit int) bool { return spins&15 == 15 || spins >= 32+limit }

// wait sleeps until *seq moves from the value seen, spinning briefly first
// and yielding its core limit times.
func wait(seq, flag *uint32, seen uint32, spins *int, limit int) {
	*spins++
	if *spins < 32 {
		runtime.Gosched()
		return
	}
	if *spins < 32+limit {
		// Let another process (a peer rank) run on this core, then look again.
		unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		return
	}
	atomic.StoreUint32(flag, 1)
	if atomic.LoadUint32(seq) == seen {
		futexWait(seq, seen, 2*time.Millisecond)
	}
	atomic.StoreUint32(flag, 0)
}

// write appends parts to the ring, publishing as space allows.
func (t *shmTransport) write(dl collective.Deadline, r *shmRing, parts ...[]byte) error {
	head := atomic.LoadUint64(r.u64(offHead))
	spins := 0
	for _, p := range parts {
		for len(p) > 0 {
			free := r.cap - (head - r.seen)
			if free < uint64(len(p)) {
				r.seen = atomic.LoadUint64(r.u64(offTail))
				free = r.cap - (head - r.seen)
			}
			if free == 0 {
				if checkNow(spins, t.spin) {
					if err := t.check(dl, r, "sending"); err != nil {
						return err
					}
				}
				wait(r.u32(offTail), r.u32(offSpaceWait), uint32(r.seen), &spins, t.spin)
				continue
			}
			spins = 0
			pos := head % r.cap
			n := min(uint64(len(p)), free, r.cap-pos)
			copy(r.data[pos:pos+n], p[:n])
			head += n
			p = p[n:]
			if len(p) > 0 || free-n < 64 { // publish early when the ring fills
				t.publish(r, head)
			}
		}
	}
	t.publish(r, head)
	return nil
}

func (t *shmTransport) publish(r *shmRing, head uint64) {
	if atomic.LoadUint64(r.u64(offHead)) == head {
		return
	}
	atomic.StoreUint64(r.u64(offHead), head)
	if atomic.LoadUint32(r.u32(offDataWait)) != 0 {
		futexWake(r.u32(offHead))
	}
}

// read fills dst from the ring.
func (t *shmTransport) read(dl collective.Deadline, r *shmRing, dst []byte) error {
	tail := atomic.LoadUint64(r.u64(offTail))
	spins := 0
	for len(dst) > 0 {
		avail := r.seen - tail
		if avail < uint64(len(dst)) {
			r.seen = atomic.LoadUint64(r.u64(offHead))
			avail = r.seen - tail
		}
		if avail == 0 {
			if checkNow(spins, t.spin) {
				if err := t.check(dl, r, "receiving"); err != nil {
					return err
				}
			}
			wait(r.u32(offHead), r.u32(offDataWait), uint32(r.seen), &spins, t.spin)
			continue
		}
		spins = 0
		pos := tail % r.cap
		n := min(uint64(len(dst)), avail, r.cap-pos)
		copy(dst[:n], r.data[pos:pos+n])
		tail += n
		dst = dst[n:]
		atomic.StoreUint64(r.u64(offTail), tail)
		if atomic.LoadUint32(r.u32(offSpaceWait)) != 0 {
			futexWake(r.u32(offTail))
		}
	}
	return nil
}
