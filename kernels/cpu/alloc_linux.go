//go:build linux

package cpu

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

const hugePage = 2 << 20

// allocPanel returns n zeroed elements for packed panels. Large buffers come from
// an anonymous mapping advised to use transparent huge pages, so that streaming
// through megabytes of packed panels does not keep missing the TLB. The memory is
// never returned: pack buffers live as long as the process.
func allocPanel[T float](n int) []T {
	var zero T
	size := n * int(unsafe.Sizeof(zero))
	if size < hugePage {
		return make([]T, n)
	}
	b, err := unix.Mmap(-1, 0, size+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return make([]T, n)
	}
	off := 0
	if r := uintptr(unsafe.Pointer(&b[0])) % hugePage; r != 0 {
		off = int(hugePage - r)
	}
	b = b[off : off+size]
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
}
