package collective

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"unsafe"

	"github.com/meshrun/meshrun/tensor"
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

// shmArenaSize is the default arena of a rank; MESHRUN_SHM_ARENA sets it in
// bytes (0: no arena).
const shmArenaSize = 1 << 30

func arenaSize() int {
	if v, err := strconv.Atoi(os.Getenv("MESHRUN_SHM_ARENA")); err == nil && v >= 0 {
		return (v + shmArenaAlign - 1) / shmArenaAlign * shmArenaAlign
	}
	return shmArenaSize
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

// alloc hands out n bytes (rounded up to whole pages), first fit.
func (a *arena) alloc(n int) ([]byte, error) {
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
			return nil, fmt.Errorf("%w: arena: %d bytes of shared memory: %v (is /dev/shm full?)", ErrInvalid, size, err)
		}
		if f.size == size {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = span{f.off + size, f.size - size}
		}
		a.used[f.off] = size
		return b[:n], nil
	}
	return nil, fmt.Errorf("%w: arena: no free run of %d bytes in %d (MESHRUN_SHM_ARENA sets its size)", ErrInvalid, size, len(a.mem))
}

// offset returns where b starts in the arena, if it lies in it.
func (a *arena) offset(b []byte) (int, bool) {
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

// release gives back the buffer that starts at b.
func (a *arena) release(b []byte) error {
	off, ok := a.offset(b)
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

// arenaTransport is a transport whose ranks read each other's arenas.
type arenaTransport interface {
	ownArena() *arena
	// peerArena is the data region of rank's arena as mapped here (nil
	// without one, or once closed). What it returns may be read only
	// between readArenas and the function readArenas returns.
	peerArena(rank int) []byte
	// readArenas keeps the peers' arenas mapped until the returned
	// function is called.
	readArenas() func()
}

// AllocShared returns n elements of shared memory from w's arena: collectives over
// buffers from it, on every member, copy each byte once (see arena.go). It
// is valid until FreeShared (and stays mapped after Close). Without an arena (a
// transport other than shm, or MESHRUN_SHM_ARENA=0) or when it is full it
// returns an error; make is then the fallback, and the collectives work the
// same, through the rings.
func AllocShared[T Float](w *World, n int) ([]T, error) {
	at, ok := w.t.(arenaTransport)
	if !ok || at.ownArena() == nil {
		return nil, fmt.Errorf("%w: no shared-memory arena on the %s transport", ErrInvalid, w.t.Name())
	}
	var zero T
	b, err := at.ownArena().alloc(n * int(unsafe.Sizeof(zero)))
	if err != nil {
		return nil, err
	}
	return asElems[T](b), nil
}

// FreeShared gives back a buffer AllocShared returned.
func FreeShared[T Float](w *World, s []T) error {
	at, ok := w.t.(arenaTransport)
	if !ok || at.ownArena() == nil {
		return fmt.Errorf("%w: no shared-memory arena on the %s transport", ErrInvalid, w.t.Name())
	}
	return at.ownArena().release(asBytes(s))
}

// SharedHost returns host memory whose tensors come from w's arena while it
// has room (and from the Go heap after that, or on a transport without an
// arena): a program that allocates its host tensors from it gets the arena
// algorithms for every collective over them without asking. Everything but
// Alloc and Free is host's (tensor.Host).
func SharedHost(w *World) tensor.Memory {
	if at, ok := w.t.(arenaTransport); !ok || at.ownArena() == nil {
		return tensor.Host
	}
	return sharedHost{Memory: tensor.Host, w: w}
}

type sharedHost struct {
	tensor.Memory
	w *World
}

func (m sharedHost) Alloc(dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	n := tensor.NumElements(shape)
	if n > 0 {
		var t *tensor.Tensor
		var err error
		switch dt {
		case tensor.Float32:
			var b []float32
			if b, err = AllocShared[float32](m.w, n); err == nil {
				t, err = tensor.FromFloat32(b, shape...)
			}
		case tensor.Float64:
			var b []float64
			if b, err = AllocShared[float64](m.w, n); err == nil {
				t, err = tensor.FromFloat64(b, shape...)
			}
		case tensor.BFloat16:
			var b []tensor.BF16
			if b, err = AllocShared[tensor.BF16](m.w, n); err == nil {
				t, err = tensor.FromBFloat16(b, shape...)
			}
		default:
			err = ErrInvalid
		}
		if err == nil {
			return t, nil // fresh arena pages are zero
		}
	}
	return m.Memory.Alloc(dt, shape...)
}

func (m sharedHost) Free(t *tensor.Tensor) error {
	if t == nil || !t.OnHost() || t.Len() == 0 {
		return m.Memory.Free(t)
	}
	at := m.w.t.(arenaTransport)
	b := tensor.HostBytes(t)
	if _, ok := at.ownArena().offset(b); ok {
		return at.ownArena().release(b)
	}
	return m.Memory.Free(t)
}
