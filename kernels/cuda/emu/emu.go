//go:build cudaemu

// The cuda provider's CUDA C kernels (kernels/cuda/src), run on
// the CPU, one thread after another, so that their arithmetic is tested
// against the cpu provider without a GPU (go test -tags cudaemu; CI's
// .ci/checks.d/cuda-kernels.sh). The sums follow the provider's launch
// shapes (kernels/cuda: MSEThreads, SumThreads).

package emu

/*
#cgo CXXFLAGS: -std=c++17 -O2
#include "emu.h"
*/
import "C"

import (
	"unsafe"

	"github.com/meshrun/meshrun/tensor"
)

func ptr[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

func code(dt tensor.DType) C.int {
	switch dt {
	case tensor.Float32:
		return 0
	case tensor.Float64:
		return 1
	}
	return 2
}

// Gelu runs gelu_* (dy nil) or gelu_grad_* over n elements with threads
// threads; y, dy and x are host tensors of one dtype.
func Gelu(y, dy, x *tensor.Tensor, threads int) {
	var d unsafe.Pointer
	if dy != nil {
		d = ptr(tensor.HostBytes(dy))
	}
	C.emu_gelu(code(x.DType()), ptr(tensor.HostBytes(y)), d, ptr(tensor.HostBytes(x)), C.ulonglong(x.Len()), C.uint(threads))
}

// MSE runs mse_* with threads threads, then the two sum stages, as the
// provider launches them; it returns the sum.
func MSE(dy, y, t *tensor.Tensor, scale float64, threads, sumThreads int) float64 {
	part := make([]float64, threads)
	C.emu_mse(code(y.DType()), ptr(tensor.HostBytes(dy)), (*C.double)(ptr(part)), ptr(tensor.HostBytes(y)), ptr(tensor.HostBytes(t)),
		C.double(scale), C.ulonglong(y.Len()), C.uint(threads))
	part2 := make([]float64, sumThreads)
	C.emu_sum_stage((*C.double)(ptr(part2)), (*C.double)(ptr(part)), C.ulonglong(threads), C.uint(sumThreads))
	var sum [1]float64
	C.emu_sum_stage((*C.double)(ptr(sum[:])), (*C.double)(ptr(part2)), C.ulonglong(sumThreads), 1)
	return sum[0]
}

// Axpy runs axpy_bf16.
func Axpy(alpha float32, x, y *tensor.Tensor, threads int) {
	C.emu_axpy_bf16(ptr(tensor.HostBytes(y)), ptr(tensor.HostBytes(x)), C.float(alpha), C.ulonglong(y.Len()), C.uint(threads))
}

// Cast runs cast_f32_bf16 or cast_bf16_f32 (by dst's dtype).
func Cast(dst, src *tensor.Tensor, threads int) {
	to16 := C.int(0)
	if dst.DType() == tensor.BFloat16 {
		to16 = 1
	}
	C.emu_cast(to16, ptr(tensor.HostBytes(dst)), ptr(tensor.HostBytes(src)), C.ulonglong(dst.Len()), C.uint(threads))
}

// BiasGrad runs bias_grad_bf16 (db bfloat16) or bias_grad_bf16_f32 (db
// float32) over dy's m rows of n.
func BiasGrad(db, dy *tensor.Tensor, m, n int, accumulate bool, threads int) {
	acc, db32 := C.int(0), C.int(0)
	if accumulate {
		acc = 1
	}
	if db.DType() == tensor.Float32 {
		db32 = 1
	}
	C.emu_bias_grad_bf16(ptr(tensor.HostBytes(db)), db32, ptr(tensor.HostBytes(dy)), C.ulonglong(m), C.ulonglong(n), acc, C.uint(threads))
}
