package sim

import (
	"fmt"
	"runtime"
	"sort"
	"sync"
	"weak"

	"github.com/meshrun/meshrun/tensor"
)

// Device addresses. A sim buffer has an address, as a GPU allocation has one:
// an opaque number that code outside the device (a collective library working
// on raw addresses, as NCCL does) passes around and that only the device
// resolves. Addresses are unique in the process, never reused, 256-byte
// aligned (as cudaMalloc's), and leave a gap after every buffer, so an access
// past a buffer's end resolves to nothing instead of to its neighbour.

// addrBase is the first address handed out: far from anything a real pointer
// would be mistaken for.
const addrBase = 0x5100_0000_0000

var space struct {
	mu    sync.Mutex
	next  uintptr
	bases []uintptr                        // sorted: allocation order
	bufs  map[uintptr]weak.Pointer[buffer] // a buffer nobody holds is collected, and forgotten
}

// assign gives b its address and records it.
func assign(b *buffer) {
	space.mu.Lock()
	defer space.mu.Unlock()
	if space.bufs == nil {
		space.next, space.bufs = addrBase, map[uintptr]weak.Pointer[buffer]{}
	}
	b.addr = space.next
	space.next += (uintptr(len(b.data)) + 511) &^ 255
	space.bases = append(space.bases, b.addr)
	space.bufs[b.addr] = weak.Make(b)
	runtime.AddCleanup(b, forget, b.addr)
}

// release forgets b's address (Free).
func release(b *buffer) { forget(b.addr) }

func forget(addr uintptr) {
	space.mu.Lock()
	defer space.mu.Unlock()
	if _, ok := space.bufs[addr]; !ok {
		return
	}
	delete(space.bufs, addr)
	i := sort.Search(len(space.bases), func(i int) bool { return space.bases[i] >= addr })
	if i < len(space.bases) && space.bases[i] == addr {
		space.bases = append(space.bases[:i], space.bases[i+1:]...)
	}
}

// Addr returns the buffer's device address.
func (b *buffer) Addr() uintptr { return b.addr }

// Resolve returns the n bytes of sim device memory at addr: what a device
// library (the fake NCCL of package collective) reads and writes. It fails
// unless [addr, addr+n) lies inside one live buffer.
func Resolve(addr uintptr, n int) ([]byte, error) {
	space.mu.Lock()
	defer space.mu.Unlock()
	i := sort.Search(len(space.bases), func(i int) bool { return space.bases[i] > addr }) - 1
	var b *buffer
	if i >= 0 {
		b = space.bufs[space.bases[i]].Value()
	}
	if b != nil {
		off := int(addr - b.addr)
		if n >= 0 && off+n <= len(b.data) {
			return b.data[off : off+n : off+n], nil
		}
		if n >= 0 && n == 0 && off == len(b.data) {
			return nil, nil
		}
	}
	return nil, fmt.Errorf("%w: %d bytes at sim address %#x: not inside a live buffer", tensor.ErrDevice, n, addr)
}
