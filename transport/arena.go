package transport

import (
	"fmt"
	"sort"
	"sync"
	"unsafe"

	"github.com/meshrun/meshrun/collective"
	"golang.org/x/sys/unix"
)

// The shared-memory arena: on the shm transport every rank maps a region of
// shared memory (its arena) and every other rank of the host maps it too.
// Buffers a program takes from its arena (AllocShared) can be read
// by the peers with a plain memory copy: the all-gather copies each peer's
// segment once, straight from the peer's buffer into the output; the
// reduce-scatter reads its chunk of every peer's input and sums them in one
// pass; the all-reduce does both. Buffers from anywhere else travel through
// the rings (two copies: into the ring, out of it).
//
// The arena is a /dev/shm file named like the rings (the ring from a rank to
// itself, which no job has otherwise), created exclusively by its owner and
// checked by each peer as a ring is; the owner unlinks it once every peer has
// mapped it, so nothing is left in /dev/shm once setup is over, even if a
// rank is killed. Its size is address space only: pages are allocated when
// AllocShared hands them out (madvise MADV_POPULATE_WRITE, which fails with an
// error where the host's shared memory is full, rather than a SIGBUS on the
// first write) and given back by FreeShared (MADV_REMOVE).

// shmArenaSize is the default arena of a rank; ShmOptions.ArenaBytes
// (MESHRUN_SHM_ARENA) sets it.
const shmArenaSize = 1 << 30

// arenaSize is the arena of ShmOptions.ArenaBytes n, in whole pages (0: none).
func arenaSize(n int) int {
	switch {
	case n < 0:
		return 0
	case n == 0:
		return shmArenaSize
	}
	return (n + shmArenaAlign - 1) / shmArenaAlign * shmArenaAlign
}

// shmArenaAlign aligns every buffer of the arena (a page: FreeShared gives whole
// pages back).
const shmArenaAlign = 4096

type span struct{ off, size int }

// arena is a rank's own arena and its allocator.
type arena struct {
	mu   sync.Mutex
	mem  []byte      // the data region, as mapped here
	free []span      // free spans, sorted by offset, never adjacent
	used map[int]int // offset -> size of each buffer handed out
}

func newArena(mem []byte) *arena {
	return &arena{mem: mem, free: []span{{0, len(mem)}}, used: map[int]int{}}
}

// Alloc hands out n bytes (rounded up to whole pages), first fit.
func (a *arena) Alloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, invalid("arena: allocation of %d bytes", n)
	}
	size := (n + shmArenaAlign - 1) / shmArenaAlign * shmArenaAlign
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, f := range a.free {
		if f.size < size {
			continue
		}
		b := a.mem[f.off : f.off+size : f.off+size]
		if err := unix.Madvise(b, unix.MADV_POPULATE_WRITE); err != nil && err != unix.EINVAL {
			// EINVAL: a kernel before 5.14; pages then come on first use.
			return nil, fmt.Errorf("%w: arena: %d bytes of shared memory: %v (is /dev/shm full?)", collective.ErrInvalid, size, err)
		}
		if f.size == size {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = span{f.off + size, f.size - size}
		}
		a.used[f.off] = size
		return b[:n], nil
	}
	return nil, fmt.Errorf("%w: arena: no free run of %d bytes in %d (MESHRUN_SHM_ARENA sets its size)", collective.ErrInvalid, size, len(a.mem))
}

// Offset returns where b starts in the arena, if it lies in it.
func (a *arena) Offset(b []byte) (int, bool) {
	if a == nil || len(b) == 0 || len(a.mem) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(a.mem)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base || p+uintptr(len(b)) > base+uintptr(len(a.mem)) {
		return 0, false
	}
	return int(p - base), true
}

// Release gives back the buffer that starts at b.
func (a *arena) Release(b []byte) error {
	off, ok := a.Offset(b)
	if !ok {
		return invalid("arena: free of memory the arena did not hand out")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	size, ok := a.used[off]
	if !ok {
		return invalid("arena: free of memory at offset %d, which starts no buffer handed out (freed twice?)", off)
	}
	delete(a.used, off)
	unix.Madvise(a.mem[off:off+size], unix.MADV_REMOVE)
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = span{off, size}
	// Coalesce with the neighbours.
	if i+1 < len(a.free) && a.free[i].off+a.free[i].size == a.free[i+1].off {
		a.free[i].size += a.free[i+1].size
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].size == a.free[i].off {
		a.free[i-1].size += a.free[i].size
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
	return nil
}
