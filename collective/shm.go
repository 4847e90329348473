package collective

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// The shm transport: ranks on one host exchange bytes through single-producer,
// single-consumer byte rings in shared memory, one per ordered pair of ranks,
// as NCCL and MPI do within a node. A ring is a file under /dev/shm mapped with
// mmap by both processes; the producer advances head, the consumer tail (64-bit
// atomics in a control page), and a waiting side sleeps on a futex in the same
// page (bounded to a few milliseconds so that deadlines, aborts and peer death
// are noticed) after yielding its core a while (see spinLimit). The consumer unlinks the file as soon as both ends have mapped
// it, so nothing is left in /dev/shm even if a process is killed.
//
// Frames are the 80-byte Header followed by the payload; the consumer reads the
// payload straight from the ring into the caller's buffer (one copy each side).

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
// It is off unless MESHRUN_SHM_SINGLE_COPY=1: on this project's 2-core test
// machine it measured slower than the ring (the producer's wait for each ack
// stalls the pipeline, worst with more ranks than cores).
const cmaMin = 32 << 10

// spinLimit is how many times a waiter yields its core to other processes
// (sched_yield) before it sleeps on the futex; MESHRUN_SHM_SPIN overrides it.
// Yielding rather than spinning in place keeps ranks that outnumber the cores
// moving: on 2 cores, 256 yields halved 4-rank latencies against a futex sleep
// after a short in-process spin.
var spinLimit = func() int {
	if v, err := strconv.Atoi(os.Getenv("MESHRUN_SHM_SPIN")); err == nil && v >= 0 {
		return v
	}
	return 256
}()

func singleCopy() bool { return os.Getenv("MESHRUN_SHM_SINGLE_COPY") == "1" }

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
	hb   [HeaderSize]byte
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
}

func shmAvailable() bool {
	st, err := os.Stat(shmDir)
	return err == nil && st.IsDir() && unix.Access(shmDir, unix.W_OK) == nil
}

// Ring names. Every name a ring (or arena) of the job can have is drawn from
// the job's secret, which rank 0 draws afresh for each rendezvous and which
// reaches the job's ranks only in the roster, over the job's authenticated
// NATS connection: the name of try k of the ring from src to dst is
// meshrun-<HMAC-SHA256(secret, src's ring token, src, dst, k), 16 bytes in
// hex>. The names are visible to every user of the machine as soon as the
// files exist (anyone may list /dev/shm), but one name tells nothing of any
// other: a user who watches /dev/shm cannot create a ring's name before its
// producer does, and a name seen is already taken (by a file of mode 0600
// that no other user may open, nor, the directory being sticky, remove or
// rename). The producer creates its file exclusively (O_EXCL|O_NOFOLLOW,
// mode 0600); should the name be taken anyway, it logs the file and its
// owner and takes the next of shmNameTries, and when every one is taken it
// fails with ErrAuth naming the files' owners, blaming no rank. The
// consumer maps only a regular file of its own user, not open to others, of
// the ring's size, that carries the magic and the producer's token, and
// passes over anything else found at these names. Nothing of the job (no
// token, no job id, no rank) appears in a name. See docs/collective.md,
// "Shared memory and other users of the machine".
const (
	shmTokenBytes = 16
	shmNameTries  = 4
	shmNameBytes  = 16
	offToken      = 512 // producer: its token (shmTokenBytes)
)

// shmNames derives the job's ring names from its secret and every rank's
// ring token (the roster's).
type shmNames struct {
	secret []byte
	tokens [][]byte
}

func newShmNames(roster *Roster, reporter int) (*shmNames, error) {
	if len(roster.Secret) < 16 {
		return nil, &Error{Kind: ErrInvalid, Rank: -1, Reporter: reporter, Detail: fmt.Sprintf("shm setup: the roster carries no job secret to name the rings with (%d bytes)", len(roster.Secret))}
	}
	n := &shmNames{secret: roster.Secret, tokens: make([][]byte, len(roster.Ranks))}
	for i, a := range roster.Ranks {
		b, err := hex.DecodeString(a.Shm)
		if err != nil || len(b) != shmTokenBytes || hex.EncodeToString(b) != a.Shm {
			return nil, &Error{Kind: ErrInvalid, Rank: i, Reporter: reporter, Detail: fmt.Sprintf("shm setup: rank %d announced no ring token (%q)", i, a.Shm)}
		}
		n.tokens[i] = b
	}
	return n, nil
}

// path is the name of try of the ring from src to dst (dst == src: src's arena).
func (n *shmNames) path(src, dst, try int) string {
	m := hmac.New(sha256.New, n.secret)
	m.Write([]byte("meshrun shm ring name\x00"))
	m.Write(n.tokens[src])
	var b [24]byte
	binary.LittleEndian.PutUint64(b[0:], uint64(src))
	binary.LittleEndian.PutUint64(b[8:], uint64(dst))
	binary.LittleEndian.PutUint64(b[16:], uint64(try))
	m.Write(b[:])
	return filepath.Join(shmDir, "meshrun-"+hex.EncodeToString(m.Sum(nil)[:shmNameBytes]))
}

// testHookShmCreate, set by tests only, runs before a ring file is created
// at path (try of the ring from src to dst): a test plants a file there to
// stand for someone who learned the name.
var testHookShmCreate func(path string, src, dst, try int)

// NewShmTransport maps the rings between rank and every other rank of a job
// whose ranks all run on this host; the roster holds every rank's ring token.
func NewShmTransport(ctx context.Context, job string, rank, size int, roster *Roster) (Transport, error) {
	return newShmTransport(ctx, rank, size, roster, nil)
}

func newShmTransport(ctx context.Context, rank, size int, roster *Roster, log *zap.Logger) (Transport, error) {
	if log == nil {
		log = zap.NewNop()
	}
	if roster == nil || len(roster.Ranks) != size {
		return nil, &Error{Kind: ErrInvalid, Rank: -1, Reporter: rank, Detail: "shm setup: no roster of the job's ranks"}
	}
	names, err := newShmNames(roster, rank)
	if err != nil {
		return nil, err
	}
	t := &shmTransport{rank: rank, size: size, out: make([]*shmRing, size), in: make([]*shmRing, size), aborted: make([]atomic.Pointer[error], size)}
	t.probe = new(uint64)
	*t.probe = shmMagic ^ uint64(os.Getpid())
	// Rings are brought in up front while every ring of the job together
	// stays within shmPrefaultMax (8 ranks on a host); beyond, pages come as
	// messages first reach them.
	prefault := int64(size)*int64(size-1)*(shmCtrl+shmCapacity) <= shmPrefaultMax
	fail := func(peer int, err error) (Transport, error) {
		t.unmapAll()
		var e *Error
		if errors.As(err, &e) {
			e.Reporter = rank
			return nil, e
		}
		return nil, &Error{Kind: ErrPeerLost, Rank: peer, Reporter: rank, Detail: "shm setup: " + err.Error()}
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
	asize := arenaSize()
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
		r.cma = err == nil && n == 8 && word == shmMagic^uint64(r.pid) && singleCopy()
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

func (t *shmTransport) ownArena() *arena { return t.arena }

func (t *shmTransport) readArenas() func() {
	t.arenaMu.RLock()
	return t.arenaMu.RUnlock
}

func (t *shmTransport) peerArena(rank int) []byte {
	if t.arenas == nil || rank < 0 || rank >= len(t.arenas) || t.arenas[rank] == nil {
		return nil
	}
	return t.arenas[rank].data
}

// sendCMA publishes a descriptor of p and waits until the consumer has copied it.
func (t *shmTransport) sendCMA(dl Deadline, r *shmRing, p []byte) error {
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
		if checkNow(spins) {
			if err := t.check(dl, r, "sending"); err != nil {
				return err
			}
		}
		wait(r.u32(offAckSeq), r.u32(offAckWait), seen, &spins)
	}
}

// recvCMA copies the producer's buffer described in the ring into dst.
func (t *shmTransport) recvCMA(dl Deadline, r *shmRing, dst []byte) error {
	if err := t.read(dl, r, r.desc[:]); err != nil {
		return err
	}
	addr := uintptr(binary.LittleEndian.Uint64(r.desc[0:]))
	if n := binary.LittleEndian.Uint64(r.desc[8:]); n != uint64(len(dst)) {
		return &Error{Kind: ErrCorrupt, Rank: r.peer, Reporter: t.rank, Detail: fmt.Sprintf("single-copy descriptor of %d bytes for %d", n, len(dst))}
	}
	for off := 0; off < len(dst); {
		n, err := unix.ProcessVMReadv(r.pid, []unix.Iovec{{Base: &dst[off], Len: uint64(len(dst) - off)}},
			[]unix.RemoteIovec{{Base: addr + uintptr(off), Len: len(dst) - off}}, 0)
		if err != nil {
			if errors.Is(err, syscall.ESRCH) {
				return &Error{Kind: ErrPeerLost, Rank: r.peer, Reporter: t.rank, Detail: "receiving: process is gone"}
			}
			return &Error{Kind: ErrPeerLost, Rank: r.peer, Reporter: t.rank, Detail: "receiving: single copy: " + err.Error()}
		}
		if n <= 0 {
			return &Error{Kind: ErrPeerLost, Rank: r.peer, Reporter: t.rank, Detail: "receiving: single copy made no progress"}
		}
		off += n
	}
	atomic.AddUint32(r.u32(offAckSeq), 1)
	if atomic.LoadUint32(r.u32(offAckWait)) != 0 {
		futexWake(r.u32(offAckSeq))
	}
	return nil
}

// createRing creates and maps the ring from src to dst under the first free
// of its names.
func createRing(names *shmNames, src, dst int, log *zap.Logger, prefault bool, capacity int) (*shmRing, error) {
	var taken []string
	for try := 0; try < shmNameTries; try++ {
		path := names.path(src, dst, try)
		if testHookShmCreate != nil {
			testHookShmCreate(path, src, dst, try)
		}
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) {
			taken = append(taken, path)
			log.Warn("shm ring name taken by a file this job did not create; trying another",
				zap.String("file", describeFile(path)), zap.String("owner", fileOwners([]string{path})), zap.Int("try", try+1), zap.Int("tries", shmNameTries))
			continue
		}
		if err != nil {
			return nil, &Error{Kind: ErrInvalid, Rank: -1, Detail: fmt.Sprintf("shm setup: creating ring %s: %v", path, err)}
		}
		f := os.NewFile(uintptr(fd), path)
		r, err := initRing(f, names.tokens[src], prefault, capacity)
		f.Close()
		if err != nil {
			os.Remove(path)
			detail := fmt.Sprintf("shm setup: ring %s: %v", path, err)
			if errors.Is(err, unix.ENOSPC) {
				detail += fmt.Sprintf(" (%s is full: every user's files there count; MESHRUN_TRANSPORT=tcp does without it)", shmDir)
			}
			return nil, &Error{Kind: ErrInvalid, Rank: -1, Detail: detail}
		}
		return r, nil
	}
	return nil, takenError(src, dst, taken)
}

// takenError is the failure of a ring every name of which another process
// holds: it names the files' owners and blames no rank (Rank -1).
func takenError(src, dst int, paths []string) *Error {
	what := fmt.Sprintf("the ring from rank %d to rank %d", src, dst)
	if src == dst {
		what = fmt.Sprintf("the shared-memory arena of rank %d", src)
	}
	described := make([]string, len(paths))
	for i, p := range paths {
		described[i] = describeFile(p)
	}
	return &Error{Kind: ErrAuth, Rank: -1, Detail: fmt.Sprintf("shm setup: all %d names this job drew for %s are taken by files of %s, which no rank of this job made (no rank is at fault): %s",
		len(paths), what, fileOwners(paths), strings.Join(described, ", "))}
}

// fileOwners names the owners of the files at paths: "uid 65534", "uids
// 1000, 65534"; an owner that is this process's user is said to be so.
func fileOwners(paths []string) string {
	var uids []uint32
	for _, p := range paths {
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil && !slices.Contains(uids, st.Uid) {
			uids = append(uids, st.Uid)
		}
	}
	slices.Sort(uids)
	if len(uids) == 0 {
		return "owners unknown (gone since)"
	}
	words := make([]string, len(uids))
	for i, u := range uids {
		words[i] = strconv.FormatUint(uint64(u), 10)
		if int(u) == os.Geteuid() {
			words[i] += " (this job's own user)"
		}
	}
	if len(uids) == 1 {
		return "uid " + words[0]
	}
	return "uids " + strings.Join(words, ", ")
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
	copy(mem[offToken:offToken+shmTokenBytes], token)
	atomic.StoreUint64(r.u64(offMagic), shmMagic) // last: the consumer reads nothing before it
	return r, nil
}

// describeFile names path with its owner and mode, for errors and logs.
func describeFile(path string) string {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return path
	}
	return fmt.Sprintf("%s (owner uid %d, mode %#o)", path, st.Uid, st.Mode&0o7777)
}

// openRing maps the ring from src to dst once its producer has made it.
func openRing(ctx context.Context, names *shmNames, src, dst int, prefault bool, capacity int, unlink bool) (*shmRing, error) {
	token := names.tokens[src]
	paths := make([]string, shmNameTries)
	for try := range paths {
		paths[try] = names.path(src, dst, try)
	}
	seen := make([]string, shmNameTries) // what each name held that was not the ring
	for {
		foreign := 0
		for try, path := range paths {
			r, why, alien := tryOpenRing(path, token, prefault, capacity, unlink)
			if r != nil {
				return r, nil
			}
			seen[try] = why
			if alien {
				foreign++
			}
		}
		if foreign == shmNameTries {
			// The producer cannot create the ring under any name.
			return nil, takenError(src, dst, paths)
		}
		select {
		case <-ctx.Done():
			var found []string
			for _, w := range seen {
				if w != "" {
					found = append(found, w)
				}
			}
			if len(found) > 0 {
				return nil, fmt.Errorf("ring %s never appeared (passed over: %s): %w", paths[0], strings.Join(found, ", "), ctx.Err())
			}
			return nil, fmt.Errorf("ring %s never appeared: %w", paths[0], ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// tryOpenRing maps the ring at path if it is there, complete and ours, and
// unlinks it (both ends have it mapped: nothing is left behind). Otherwise why
// says what path holds ("" if nothing), and alien whether it is a file this
// job cannot have made (another owner, not a regular file, open to others).
func tryOpenRing(path string, token []byte, prefault bool, capacity int, unlink bool) (r *shmRing, why string, alien bool) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, "", false
	}
	if err != nil {
		return nil, fmt.Sprintf("%s: %v", describeFile(path), err), true
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Sprintf("%s: %v", path, err), false
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, path + ": not a regular file", true
	case st.Uid != uint32(os.Geteuid()):
		return nil, fmt.Sprintf("%s: owned by uid %d, not %d", path, st.Uid, os.Geteuid()), true
	case st.Mode&0o077 != 0:
		return nil, fmt.Sprintf("%s: mode %#o, open to others", path, st.Mode&0o7777), true
	case st.Size != int64(shmCtrl+capacity):
		return nil, fmt.Sprintf("%s: %d bytes, not a ring (yet)", path, st.Size), false
	}
	mem, err := syscall.Mmap(fd, 0, shmCtrl+capacity, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Sprintf("%s: %v", path, err), false
	}
	r = &shmRing{mem: mem, data: mem[shmCtrl:], cap: uint64(capacity), path: path}
	if atomic.LoadUint64(r.u64(offMagic)) != shmMagic {
		syscall.Munmap(mem)
		return nil, path + ": no ring header (yet)", false
	}
	if !bytes.Equal(mem[offToken:offToken+shmTokenBytes], token) {
		syscall.Munmap(mem)
		return nil, path + ": a ring of another producer", false
	}
	if prefault {
		populate(r.data, false)
	}
	if !unlink {
		return r, "", false // an arena: its owner unlinks it once every peer has it
	}
	atomic.StoreUint32(r.u32(offConsPID), uint32(os.Getpid()))
	r.dev, r.ino = st.Dev, st.Ino
	r.unlink()
	return r, "", false
}

func (t *shmTransport) Name() string  { return "shm" }
func (t *shmTransport) Rank() int     { return t.rank }
func (t *shmTransport) Size() int     { return t.size }
func (t *shmTransport) MaxChunk() int { return MaxPayload }

// check returns an error if the wait must end: abort, deadline, peer gone.
func (t *shmTransport) check(dl Deadline, r *shmRing, what string) error {
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
			return &Error{Kind: ErrPeerLost, Rank: r.peer, Reporter: t.rank, Detail: what + ": peer closed its transport"}
		}
		if p := atomic.LoadUint32(r.u32(pid)); p != 0 {
			if err := syscall.Kill(int(p), 0); errors.Is(err, syscall.ESRCH) {
				return &Error{Kind: ErrPeerLost, Rank: r.peer, Reporter: t.rank, Detail: fmt.Sprintf("%s: process %d is gone", what, p)}
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
func checkNow(spins int) bool { return spins&15 == 15 || spins >= 32+spinLimit }

// wait sleeps until *seq moves from the value seen, spinning briefly first.
func wait(seq, flag *uint32, seen uint32, spins *int) {
	*spins++
	if *spins < 32 {
		runtime.Gosched()
		return
	}
	if *spins < 32+spinLimit {
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
func (t *shmTransport) write(dl Deadline, r *shmRing, parts ...[]byte) error {
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
				if checkNow(spins) {
					if err := t.check(dl, r, "sending"); err != nil {
						return err
					}
				}
				wait(r.u32(offTail), r.u32(offSpaceWait), uint32(r.seen), &spins)
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
func (t *shmTransport) read(dl Deadline, r *shmRing, dst []byte) error {
	tail := atomic.LoadUint64(r.u64(offTail))
	spins := 0
	for len(dst) > 0 {
		avail := r.seen - tail
		if avail < uint64(len(dst)) {
			r.seen = atomic.LoadUint64(r.u64(offHead))
			avail = r.seen - tail
		}
		if avail == 0 {
			if checkNow(spins) {
				if err := t.check(dl, r, "receiving"); err != nil {
					return err
				}
			}
			wait(r.u32(offHead), r.u32(offDataWait), uint32(r.seen), &spins)
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

func (t *shmTransport) Send(dl Deadline, peer int, h *Header, p []byte) error {
	r := t.out[peer]
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mem == nil {
		return errClosedTransport
	}
	if e := t.aborted[peer].Load(); e != nil {
		return *e
	}
	h.Length = uint32(len(p))
	h.Encode(r.hb[:])
	if r.cma && len(p) >= cmaMin {
		return t.sendCMA(dl, r, p)
	}
	return t.write(dl, r, r.hb[:], p)
}

// trySend writes the message only if the ring has room for all of it now.
func (t *shmTransport) trySend(peer int, h *Header, p []byte) (bool, error) {
	r := t.out[peer]
	if r.cma && len(p) >= cmaMin {
		return false, nil
	}
	if !r.mu.TryLock() {
		return false, nil
	}
	defer r.mu.Unlock()
	if r.mem == nil {
		return false, errClosedTransport
	}
	if e := t.aborted[peer].Load(); e != nil {
		return false, *e
	}
	head := atomic.LoadUint64(r.u64(offHead))
	need := uint64(HeaderSize + len(p))
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

func (t *shmTransport) Recv(dl Deadline, peer int, want *Header, dst []byte) error {
	r := t.in[peer]
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mem == nil {
		return errClosedTransport
	}
	if e := t.aborted[peer].Load(); e != nil {
		return *e
	}
	if err := t.read(dl, r, r.hb[:]); err != nil {
		return err
	}
	got, err := DecodeHeader(r.hb[:], MaxPayload)
	if err != nil {
		return err
	}
	if err := CheckHeader(want, &got); err != nil {
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
