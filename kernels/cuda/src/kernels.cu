// The cuda provider's elementwise kernels: GELU forward and backward, the
// mean squared error with its gradient and a fixed-order float64 sum, the
// bfloat16 bias gradient, the bfloat16 axpy (SGD) and the float32 <->
// bfloat16 casts. Every kernel is a
// grid-stride loop with no barrier and no atomic, so the host emulation
// (kernels/cuda/emu) runs it thread by thread and tests it against the cpu
// provider; gen.sh compiles it to kernels.ptx, which the provider embeds.
// The math library is not used: exp is the range reduction below, so nvcc,
// clang and the host compute the same function.
#include "device.h"

// mr_exp is e^x in double: x = k·ln2 + r, |r| <= ln2/2, e^r by its Taylor
// series to degree 13 (error below 2e-17), times 2^k built in the exponent.
__device__ static inline double mr_exp(double x) {
	if (x > 700) x = 700;
	if (x < -700) x = -700;
	const double ln2 = 0.6931471805599453, invln2 = 1.4426950408889634;
	double kf = x * invln2;
	long long k = (long long)(kf < 0 ? kf - 0.5 : kf + 0.5);
	double r = x - (double)k * ln2;
	double p = 1.0 / 6227020800.0;
	p = p * r + 1.0 / 479001600.0;
	p = p * r + 1.0 / 39916800.0;
	p = p * r + 1.0 / 3628800.0;
	p = p * r + 1.0 / 362880.0;
	p = p * r + 1.0 / 40320.0;
	p = p * r + 1.0 / 5040.0;
	p = p * r + 1.0 / 720.0;
	p = p * r + 1.0 / 120.0;
	p = p * r + 1.0 / 24.0;
	p = p * r + 1.0 / 6.0;
	p = p * r + 0.5;
	p = p * r + 1.0;
	p = p * r + 1.0;
	union { unsigned long long u; double d; } s;
	s.u = (unsigned long long)(k + 1023) << 52;
	return p * s.d;
}

// tanh(u) = sign(u)·(1 − 2/(e^{2|u|} + 1)).
__device__ static inline double mr_tanh(double u) {
	double a = u < 0 ? -u : u;
	double t = a > 20 ? 1.0 : 1.0 - 2.0 / (mr_exp(2 * a) + 1.0);
	return u < 0 ? -t : t;
}

// The tanh approximation of GELU (kernels.GeluSqrt2OverPi, kernels.GeluCoeff).
#define MR_C 0.7978845608028654
#define MR_K 0.044715

__device__ static inline double gelu(double x) {
	return 0.5 * x * (1 + mr_tanh(MR_C * (x + MR_K * x * x * x)));
}

__device__ static inline double gelu_grad(double x) {
	double t = mr_tanh(MR_C * (x + MR_K * x * x * x));
	return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * MR_C * (1 + 3 * MR_K * x * x);
}

// y = gelu(x)
MR_KERNEL void gelu_f32(float *y, const float *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) y[i] = (float)gelu(x[i]);
}
MR_KERNEL void gelu_f64(double *y, const double *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) y[i] = gelu(x[i]);
}
MR_KERNEL void gelu_bf16(bf16 *y, const bf16 *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) y[i] = f2bf((float)gelu(bf2f(x[i])));
}

// dx = dy·gelu'(x)
MR_KERNEL void gelu_grad_f32(float *dx, const float *dy, const float *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) dx[i] = dy[i] * (float)gelu_grad(x[i]);
}
MR_KERNEL void gelu_grad_f64(double *dx, const double *dy, const double *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) dx[i] = dy[i] * gelu_grad(x[i]);
}
MR_KERNEL void gelu_grad_bf16(bf16 *dx, const bf16 *dy, const bf16 *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS)
		dx[i] = f2bf(bf2f(dy[i]) * (float)gelu_grad(bf2f(x[i])));
}

// dy = scale·(y − t); part[thread] = Σ over the thread's elements of
// (y − t)² in float64. The sum is finished by sum_stage (twice): a fixed
// grid makes a fixed order.
MR_KERNEL void mse_f32(float *dy, double *part, const float *y, const float *t, float scale, unsigned long long n) {
	double acc = 0;
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) {
		float d = y[i] - t[i];
		acc += (double)(d * d);
		dy[i] = d * scale;
	}
	part[MR_TID] = acc;
}
MR_KERNEL void mse_f64(double *dy, double *part, const double *y, const double *t, double scale, unsigned long long n) {
	double acc = 0;
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) {
		double d = y[i] - t[i];
		acc += d * d;
		dy[i] = d * scale;
	}
	part[MR_TID] = acc;
}
MR_KERNEL void mse_bf16(bf16 *dy, double *part, const bf16 *y, const bf16 *t, float scale, unsigned long long n) {
	double acc = 0;
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) {
		float d = bf2f(y[i]) - bf2f(t[i]);
		acc += (double)(d * d);
		dy[i] = f2bf(d * scale);
	}
	part[MR_TID] = acc;
}

// out[thread] = Σ in[thread + k·threads] for k < n/threads: one stage of
// the fixed-order sum (n a multiple of the thread count).
MR_KERNEL void sum_stage(double *out, const double *in, unsigned long long n) {
	double acc = 0;
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) acc += in[i];
	out[MR_TID] = acc;
}

// y += alpha·x, bfloat16 storage, float32 arithmetic, rounded once.
MR_KERNEL void axpy_bf16(bf16 *y, const bf16 *x, float alpha, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) y[i] = f2bf(bf2f(y[i]) + alpha * bf2f(x[i]));
}

MR_KERNEL void cast_f32_bf16(bf16 *y, const float *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) y[i] = f2bf(x[i]);
}
MR_KERNEL void cast_bf16_f32(float *y, const bf16 *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) y[i] = bf2f(x[i]);
}

// db[j] (+)= Σ over the m rows of dy[i·n + j], float32 accumulation, one
// thread per column (neighbouring threads read neighbouring elements);
// db in float32 (the master gradient) or bfloat16 (rounded once).
MR_KERNEL void bias_grad_bf16_f32(float *db, const bf16 *dy, unsigned long long m, unsigned long long n, int accumulate) {
	for (unsigned long long j = MR_TID; j < n; j += MR_NTHREADS) {
		float acc = accumulate ? db[j] : 0.0f;
		for (unsigned long long i = 0; i < m; i++) acc += bf2f(dy[i * n + j]);
		db[j] = acc;
	}
}
MR_KERNEL void bias_grad_bf16(bf16 *db, const bf16 *dy, unsigned long long m, unsigned long long n, int accumulate) {
	for (unsigned long long j = MR_TID; j < n; j += MR_NTHREADS) {
		float acc = accumulate ? bf2f(db[j]) : 0.0f;
		for (unsigned long long i = 0; i < m; i++) acc += bf2f(dy[i * n + j]);
		db[j] = f2bf(acc);
	}
}
