//go:build cuda

package cuda

/*
#cgo LDFLAGS: -lcuda
#include <stdint.h>
#include <string.h>
#include <cuda.h>

// mr_copy2d queues rows copies of width bytes between device addresses at
// the given pitches on stream. gorgonia.org/cu's Memcpy2DAsync cannot be
// used: it dereferences its descriptor's array fields, nil for device
// memory, and crashes before the call.
static CUresult mr_copy2d(uint64_t dst, size_t dpitch, uint64_t src, size_t spitch, size_t width, size_t rows,
		uint64_t stream) {
	CUDA_MEMCPY2D c;
	memset(&c, 0, sizeof c);
	c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	c.srcDevice = (CUdeviceptr)src;
	c.srcPitch = spitch;
	c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	c.dstDevice = (CUdeviceptr)dst;
	c.dstPitch = dpitch;
	c.WidthInBytes = width;
	c.Height = rows;
	return cuMemcpy2DAsync(&c, (CUstream)(uintptr_t)stream);
}
*/
import "C"

import (
	"fmt"

	"gorgonia.org/cu"
)

// copy2D queues a copy of rows rows of width bytes between device
// addresses at the given pitches (inside do).
func (p *Provider) copy2D(dst uint64, dstPitch int, src uint64, srcPitch, width, rows int) error {
	if rows == 1 || width == dstPitch && width == srcPitch {
		return cu.MemcpyDtoDAsync(cu.DevicePtr(dst), cu.DevicePtr(src), int64(width*rows), p.stream)
	}
	if r := C.mr_copy2d(C.uint64_t(dst), C.size_t(dstPitch), C.uint64_t(src), C.size_t(srcPitch), C.size_t(width), C.size_t(rows),
		C.uint64_t(p.Stream())); r != C.CUDA_SUCCESS {
		return fmt.Errorf("cuda: cuMemcpy2DAsync %d rows of %d bytes (pitches %d, %d): CUresult %d", rows, width, dstPitch, srcPitch, int(r))
	}
	return nil
}
