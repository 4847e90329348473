//go:build cudaemu

// Host emulation of the provider's CUDA kernels (build tag cudaemu): each
// kernel's threads run one after another on the CPU.
#include "../src/kernels.cu"
#include "emu.h"

thread_local unsigned mr_tid, mr_nthreads;

template <class F> static void grid(unsigned threads, F f) {
	mr_nthreads = threads;
	for (unsigned t = 0; t < threads; t++) {
		mr_tid = t;
		f();
	}
}

void emu_gelu(int dt, void *y, const void *dy, const void *x, unsigned long long n, unsigned threads) {
	switch (dt) {
	case 0: grid(threads, [&] { dy ? gelu_grad_f32((float *)y, (const float *)dy, (const float *)x, n) : gelu_f32((float *)y, (const float *)x, n); }); break;
	case 1: grid(threads, [&] { dy ? gelu_grad_f64((double *)y, (const double *)dy, (const double *)x, n) : gelu_f64((double *)y, (const double *)x, n); }); break;
	default: grid(threads, [&] { dy ? gelu_grad_bf16((bf16 *)y, (const bf16 *)dy, (const bf16 *)x, n) : gelu_bf16((bf16 *)y, (const bf16 *)x, n); });
	}
}

void emu_mse(int dt, void *dy, double *part, const void *y, const void *t, double scale, unsigned long long n, unsigned threads) {
	switch (dt) {
	case 0: grid(threads, [&] { mse_f32((float *)dy, part, (const float *)y, (const float *)t, (float)scale, n); }); break;
	case 1: grid(threads, [&] { mse_f64((double *)dy, part, (const double *)y, (const double *)t, scale, n); }); break;
	default: grid(threads, [&] { mse_bf16((bf16 *)dy, part, (const bf16 *)y, (const bf16 *)t, (float)scale, n); });
	}
}

void emu_sum_stage(double *out, const double *in, unsigned long long n, unsigned threads) {
	grid(threads, [&] { sum_stage(out, in, n); });
}

void emu_axpy_bf16(void *y, const void *x, float alpha, unsigned long long n, unsigned threads) {
	grid(threads, [&] { axpy_bf16((bf16 *)y, (const bf16 *)x, alpha, n); });
}

void emu_cast(int to16, void *y, const void *x, unsigned long long n, unsigned threads) {
	grid(threads, [&] { to16 ? cast_f32_bf16((bf16 *)y, (const float *)x, n) : cast_bf16_f32((float *)y, (const bf16 *)x, n); });
}

void emu_bias_grad_bf16(void *db, int db32, const void *dy, unsigned long long m, unsigned long long n, int accumulate, unsigned threads) {
	grid(threads, [&] { db32 ? bias_grad_bf16_f32((float *)db, (const bf16 *)dy, m, n, accumulate) : bias_grad_bf16((bf16 *)db, (const bf16 *)dy, m, n, accumulate); });
}
