// device.h: what the kernels in kernels.h need from the compiler, for the
// three that build them: nvcc, clang (to PTX, without the CUDA headers: see
// gen.sh) and a host C++ compiler (the emulation that tests them on a CPU,
// emu.go: every kernel is a grid-stride loop without barriers,
// so running its threads one after another gives the same result).
#pragma once

#if defined(__CUDACC__) && !defined(__clang__)
// nvcc: everything is built in.
#define MR_KERNEL extern "C" __global__
#define MR_TID (blockIdx.x * blockDim.x + threadIdx.x)
#define MR_NTHREADS (blockDim.x * gridDim.x)
#define MR_SQRT(x) sqrt(x)
#elif defined(__CUDA__) && defined(__clang__)
// clang -x cuda --cuda-device-only -nocudainc: the special registers
// through NVVM's builtins.
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define MR_KERNEL extern "C" __global__
#define MR_TID (__nvvm_read_ptx_sreg_ctaid_x() * __nvvm_read_ptx_sreg_ntid_x() + __nvvm_read_ptx_sreg_tid_x())
#define MR_NTHREADS (__nvvm_read_ptx_sreg_ntid_x() * __nvvm_read_ptx_sreg_nctaid_x())
#define MR_SQRT(x) __builtin_sqrt(x)
#else
// host emulation: emu.h sets the thread index and count before each call.
#define __device__
#define MR_KERNEL extern "C"
extern thread_local unsigned mr_tid, mr_nthreads;
#define MR_TID mr_tid
#define MR_NTHREADS mr_nthreads
#define MR_SQRT(x) __builtin_sqrt(x)
#endif

// MR_UNROLL before a loop that sums over a slice: the GPU compilers unroll
// it 8 times, so that 8 loads are in flight before the first add (the adds
// stay in order: the same sum).
#if defined(__CUDACC__) || defined(__CUDA__)
#define MR_UNROLL _Pragma("unroll 8")
#else
#define MR_UNROLL
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
