//go:build cuda

package cuda

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// HostAlloc implements tensor.Memory: page-locked host memory (cuMemAllocHost),
// which the staged collectives' copies reach by DMA at the bus's speed.
func (m *Memory) HostAlloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	var p unsafe.Pointer
	err := m.p.do(func() error {
		if r := C.cuMemAllocHost(&p, C.size_t(n)); r != C.CUDA_SUCCESS {
			return fmt.Errorf("cuda: cuMemAllocHost %d bytes: CUresult %d", n, int(r))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// HostFree implements tensor.Memory.
func (m *Memory) HostFree(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return m.p.do(func() error {
		if r := C.cuMemFreeHost(unsafe.Pointer(unsafe.SliceData(b))); r != C.CUDA_SUCCESS {
			return fmt.Errorf("cuda: cuMemFreeHost: CUresult %d", int(r))
		}
		return nil
	})
}
