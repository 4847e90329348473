package transport

import (
	"os"
	"unsafe"

	"github.com/meshrun/meshrun/collective"
	"golang.org/x/sys/unix"
)

// SetShmCreateHook makes f run before every ring file is created, with its
// path and which try of which ring it is (src == dst: src's arena); the
// returned function removes it.
func SetShmCreateHook(f func(path string, src, dst, try int)) (restore func()) {
	testHookShmCreate = f
	return func() { testHookShmCreate = nil }
}

// SetShmDir makes the shm transport keep its rings in dir; the returned
// function restores /dev/shm.
func SetShmDir(dir string) (restore func()) {
	old := shmDir
	shmDir = dir
	return func() { shmDir = old }
}

// RingPages counts the pages of t's shm rings (both directions, data only)
// and how many of them are mapped in this process (mincore).
func RingPages(t collective.Transport) (resident, total int, err error) {
	st, ok := t.(*shmTransport)
	if !ok {
		return 0, 0, invalid("not an shm transport: %s", t.Name())
	}
	for _, rings := range [][]*shmRing{st.out, st.in} {
		for _, r := range rings {
			if r == nil {
				continue
			}
			vec := make([]byte, (len(r.data)+os.Getpagesize()-1)/os.Getpagesize())
			if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&r.data[0])), uintptr(len(r.data)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
				return 0, 0, e
			}
			for _, v := range vec {
				resident += int(v & 1)
			}
			total += len(vec)
		}
	}
	return resident, total, nil
}
