// device.h: what the kernels in kernels.h need from the compiler, for the
// three that build them: nvcc, clang (to PTX, without the CUDA headers: see
// gen.sh) and a host C++ compiler (the emulation that tests them on a CPU,
// emu.go: most kernels are grid-stride loops without barriers, so running
// their threads one after another gives the same result; the fused
// attention's block kernels run each block's threads together).
#pragma once

#if defined(__CUDACC__) && !defined(__clang__)
// nvcc: everything is built in.
#define MR_KERNEL extern "C" __global__
#define MR_TID (blockIdx.x * blockDim.x + threadIdx.x)
#define MR_NTHREADS (blockDim.x * gridDim.x)
#define MR_TX threadIdx.x
#define MR_BID blockIdx.x
#define MR_SHARED __shared__
#define MR_SYNC() __syncthreads()
#define MR_SQRT(x) sqrt(x)
#elif defined(__CUDA__) && defined(__clang__)
// clang -x cuda --cuda-device-only -nocudainc: the special registers
// through NVVM's builtins.
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define MR_KERNEL extern "C" __global__
#define MR_TID (__nvvm_read_ptx_sreg_ctaid_x() * __nvvm_read_ptx_sreg_ntid_x() + __nvvm_read_ptx_sreg_tid_x())
#define MR_NTHREADS (__nvvm_read_ptx_sreg_ntid_x() * __nvvm_read_ptx_sreg_nctaid_x())
#define MR_TX __nvvm_read_ptx_sreg_tid_x()
#define MR_BID __nvvm_read_ptx_sreg_ctaid_x()
#define MR_SHARED __attribute__((shared))
#define MR_SYNC() __nvvm_bar_sync(0)
#define MR_SQRT(x) __builtin_sqrt(x)
#else
// host emulation: emu.cc sets the thread index and count before each call.
// The block kernels (MR_TX, MR_BID, MR_SHARED, MR_SYNC) run a block at a
// time, its threads as OS threads meeting at a barrier; a block's shared
// memory is the function's static arrays.
#define __device__
#define MR_KERNEL extern "C"
extern thread_local unsigned mr_tid, mr_nthreads, mr_tx, mr_bid;
void mr_sync();
#define MR_TID mr_tid
#define MR_NTHREADS mr_nthreads
#define MR_TX mr_tx
#define MR_BID mr_bid
#define MR_SHARED static
#define MR_SYNC() mr_sync()
#define MR_SQRT(x) __builtin_sqrt(x)
#endif

// MR_UNROLL before a loop that sums over a slice: the GPU compilers unroll
// it 8 times, so that 8 loads are in flight before the first add (the adds
// stay in order: the same sum).
// MR_UNROLL_ALL unrolls a loop of a constant count whole, so that the
// arrays it indexes stay in registers.
#if defined(__CUDACC__) || defined(__CUDA__)
#define MR_UNROLL _Pragma("unroll 8")
#define MR_UNROLL_ALL _Pragma("unroll")
#else
#define MR_UNROLL
#define MR_UNROLL_ALL
#endif

typedef unsigned short bf16;

__device__ static inline float bf2f(bf16 v) {
	union { unsigned u; float f; } x;
	x.u = (unsigned)v << 16;
	return x.f;
}

// f2bf rounds to nearest even (NaN stays NaN), as tensor.ToBF16 does.
__device__ static inline bf16 f2bf(float f) {
	union { unsigned u; float f; } x;
	x.f = f;
	if ((x.u & 0x7fffffffu) > 0x7f800000u) return (bf16)((x.u >> 16) | 0x40);
	x.u += 0x7fffu + ((x.u >> 16) & 1u);
	return (bf16)(x.u >> 16);
}

// Loads and stores of float32 or bfloat16 data as float (bfloat16 rounded
// once, to nearest even).
__device__ static inline float ld(const float *p, unsigned long long i) { return p[i]; }
__device__ static inline float ld(const bf16 *p, unsigned long long i) { return bf2f(p[i]); }
__device__ static inline void st(float *p, unsigned long long i, float v) { p[i] = v; }
__device__ static inline void st(bf16 *p, unsigned long long i, float v) { p[i] = f2bf(v); }
