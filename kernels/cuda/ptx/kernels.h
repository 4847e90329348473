// The cuda provider's kernels: GELU forward and backward, the mean squared
// error with its gradient and a fixed-order float64 sum, the bfloat16 bias
// gradient, the bfloat16 axpy (SGD), the float32 <-> bfloat16 casts, and the
// transformer's ops (layer norm, embedding, cross-entropy, AdamW). Every
// kernel is a grid-stride loop with no barrier and no atomic, so the host
// emulation (emu.go) runs it thread by thread and tests it against the cpu
// provider; gen.sh compiles it to kernels.ptx, which the provider embeds.
// It is a header so that the Go build tracks it for the emulation. The math
// library is not used: exp and log are the range reductions below, so nvcc,
// clang and the host compute the same functions.
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

// mr_expf is e^x in float, 0 below −87 (−inf too), e^88 above 88: x =
// k·ln2 + r (ln2 in two parts, Cody and Waite's), |r| <= ln2/2, e^r by its
// Taylor series to degree 7 (error below 6e-9), times 2^k built in the
// exponent.
__device__ static inline float mr_expf(float x) {
	if (x < -87.0f) return 0.0f;
	if (x > 88.0f) x = 88.0f;
	float kf = x * 1.44269504f;
	int k = (int)(kf < 0 ? kf - 0.5f : kf + 0.5f);
	float r = (x - (float)k * 0.693145751953125f) - (float)k * 1.428606765330187e-06f;
	float p = 1.0f / 5040.0f;
	p = p * r + 1.0f / 720.0f;
	p = p * r + 1.0f / 120.0f;
	p = p * r + 1.0f / 24.0f;
	p = p * r + 1.0f / 6.0f;
	p = p * r + 0.5f;
	p = p * r + 1.0f;
	p = p * r + 1.0f;
	union { unsigned u; float f; } s;
	s.u = (unsigned)(k + 127) << 23;
	return p * s.f;
}

// GELU and its derivative in float, for float32 and bfloat16 data (the
// float64 arithmetic above ran the GELU kernels several times slower than
// their memory on the H200): with u = C·(x + K·x³) and s = 1 − tanh|u| =
// 2/(e^{2|u|} + 1), 1 + tanh u is s or 2 − s and 1 − tanh²u = s·(2 − s),
// so that no difference of nearly equal terms loses the small values.
__device__ static inline float gelu_s(float x, float *s) {
	float u = (float)MR_C * (x + (float)MR_K * x * x * x), a = u < 0 ? -u : u;
	*s = a > 43 ? 0.0f : 2.0f / (mr_expf(2 * a) + 1.0f);
	return u < 0 ? *s : 2.0f - *s;
}
__device__ static inline float gelu_f(float x) {
	float s, one_t = gelu_s(x, &s);
	return 0.5f * x * one_t;
}
__device__ static inline float gelu_grad_f(float x) {
	float s, one_t = gelu_s(x, &s);
	return 0.5f * one_t + 0.5f * x * (s * (2.0f - s)) * (float)MR_C * (1.0f + 3.0f * (float)MR_K * x * x);
}

// y = gelu(x)
MR_KERNEL void gelu_f32(float *y, const float *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) y[i] = gelu_f(x[i]);
}
MR_KERNEL void gelu_f64(double *y, const double *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) y[i] = gelu(x[i]);
}
MR_KERNEL void gelu_bf16(bf16 *y, const bf16 *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) y[i] = f2bf(gelu_f(bf2f(x[i])));
}

// dx = dy·gelu'(x)
MR_KERNEL void gelu_grad_f32(float *dx, const float *dy, const float *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) dx[i] = dy[i] * gelu_grad_f(x[i]);
}
MR_KERNEL void gelu_grad_f64(double *dx, const double *dy, const double *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) dx[i] = dy[i] * gelu_grad(x[i]);
}
MR_KERNEL void gelu_grad_bf16(bf16 *dx, const bf16 *dy, const bf16 *x, unsigned long long n) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS)
		dx[i] = f2bf(bf2f(dy[i]) * gelu_grad_f(bf2f(x[i])));
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

// The bias gradient in two stages: bias_part sums each chunk of rows of
// each column (one thread per chunk and column: a GEMM's m rows give m/chunk
// times the threads of one per column), in double; bias_sum adds a column's
// chunks in order and writes db[j] (+)= the sum, in float32 (the master
// gradient) or bfloat16 (rounded once).
MR_KERNEL void bias_part_bf16(double *part, const bf16 *dy, unsigned long long m, unsigned long long n, unsigned long long chunk) {
	unsigned long long nc = (m + chunk - 1) / chunk;
	for (unsigned long long e = MR_TID; e < nc * n; e += MR_NTHREADS) {
		unsigned long long c = e / n, j = e % n, lo = c * chunk, hi = lo + chunk < m ? lo + chunk : m;
		double acc = 0;
		MR_UNROLL for (unsigned long long i = lo; i < hi; i++) acc += (double)bf2f(dy[i * n + j]);
		part[e] = acc;
	}
}
MR_KERNEL void bias_sum_bf16_f32(float *db, const double *part, unsigned long long nc, unsigned long long n, int accumulate) {
	for (unsigned long long j = MR_TID; j < n; j += MR_NTHREADS) {
		double acc = 0;
		MR_UNROLL for (unsigned long long c = 0; c < nc; c++) acc += part[c * n + j];
		db[j] = (accumulate ? db[j] : 0.0f) + (float)acc;
	}
}
MR_KERNEL void bias_sum_bf16(bf16 *db, const double *part, unsigned long long nc, unsigned long long n, int accumulate) {
	for (unsigned long long j = MR_TID; j < n; j += MR_NTHREADS) {
		double acc = 0;
		MR_UNROLL for (unsigned long long c = 0; c < nc; c++) acc += part[c * n + j];
		db[j] = f2bf((accumulate ? bf2f(db[j]) : 0.0f) + (float)acc);
	}
}

// ---- The transformer's ops (float32 or bfloat16 data; statistics, ids and
// targets in float32). Per-row work runs one thread per row, per-column work
// one thread per column: no barrier, no atomic.

// mr_log is ln x for x > 0 in double: x = 2^k·m, m in [√½, √2), ln m =
// 2·atanh(s), s = (m − 1)/(m + 1), |s| <= 0.1716, by its series to s^23.
__device__ static inline double mr_log(double x) {
	union { unsigned long long u; double d; } b;
	b.d = x;
	long long k = (long long)((b.u >> 52) & 0x7ff) - 1023;
	b.u = (b.u & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL; // m in [1, 2)
	double m = b.d;
	if (m > 1.4142135623730951) {
		m *= 0.5;
		k++;
	}
	double s = (m - 1) / (m + 1), s2 = s * s, t = 0;
	for (int i = 23; i >= 1; i -= 2) t = t * s2 + 1.0 / i;
	return (double)k * 0.6931471805599453 + 2 * s * t;
}

// row is the table or vocabulary row of an id (an integer held as a float)
// in a shard of rows from offset, or -1.
__device__ static inline long long mr_row(float id, long long offset, long long rows) {
	double x = id;
	long long r = (long long)(x < 0 ? x - 0.5 : x + 0.5) - offset;
	return r >= 0 && r < rows ? r : -1;
}

// y[i, c] = table[row(ids[i]), c], zeros for ids outside the shard.
template <class T>
__device__ static void embedding(T *y, const float *ids, const T *table, long long offset, unsigned long long rows,
		unsigned long long d, unsigned long long n) {
	for (unsigned long long e = MR_TID; e < n * d; e += MR_NTHREADS) {
		unsigned long long i = e / d, c = e % d;
		long long r = mr_row(ids[i], offset, (long long)rows);
		st(y, e, r < 0 ? 0.0f : ld(table, (unsigned long long)r * d + c));
	}
}
MR_KERNEL void embedding_f32(float *y, const float *ids, const float *table, long long offset, unsigned long long rows,
		unsigned long long d, unsigned long long n) { embedding(y, ids, table, offset, rows, d, n); }
MR_KERNEL void embedding_bf16(bf16 *y, const float *ids, const bf16 *table, long long offset, unsigned long long rows,
		unsigned long long d, unsigned long long n) { embedding(y, ids, table, offset, rows, d, n); }

// dtable[row(ids[i]), c] += dy[i, c] into a float32 table (the provider
// zeroes it, or widens a bfloat16 one, first), one thread per column: ids
// that repeat add in id order.
template <class T>
__device__ static void embedding_grad(float *dtable, const T *dy, const float *ids, long long offset, unsigned long long rows,
		unsigned long long d, unsigned long long n) {
	for (unsigned long long c = MR_TID; c < d; c += MR_NTHREADS)
		for (unsigned long long i = 0; i < n; i++) {
			long long r = mr_row(ids[i], offset, (long long)rows);
			if (r >= 0) dtable[(unsigned long long)r * d + c] += ld(dy, i * d + c);
		}
}
MR_KERNEL void embedding_grad_f32(float *dtable, const float *dy, const float *ids, long long offset, unsigned long long rows,
		unsigned long long d, unsigned long long n) { embedding_grad(dtable, dy, ids, offset, rows, d, n); }
MR_KERNEL void embedding_grad_bf16(float *dtable, const bf16 *dy, const float *ids, long long offset, unsigned long long rows,
		unsigned long long d, unsigned long long n) { embedding_grad(dtable, dy, ids, offset, rows, d, n); }

// The embedding gradient in stages, where chunks of the table fit a
// scratch (ptx.EmbedChunks): emb_part, one thread per chunk k of chunk
// tokens and column c, sums dy[i, c] over the chunk's tokens into their
// rows, part[(k·rows + r)·d + c], in double and token order (0 for a row
// the chunk lacks); emb_sum, one thread per element of the table, adds
// the chunks' sums to it in chunk order. One thread per column over every
// token (embedding_grad) left most of the GPU idle: 1.1 ms a call on the
// H100 for 4,096 tokens × 768.
template <class T>
__device__ static void emb_part(double *part, const T *dy, const float *ids, long long offset, unsigned long long rows, unsigned long long d, unsigned long long n, unsigned long long chunk) {
	unsigned long long nk = (n + chunk - 1) / chunk;
	for (unsigned long long e = MR_TID; e < nk * d; e += MR_NTHREADS) {
		unsigned long long k = e / d, c = e % d;
		double *p = part + k * rows * d + c;
		for (unsigned long long r = 0; r < rows; r++) p[r * d] = 0;
		unsigned long long hi = (k + 1) * chunk < n ? (k + 1) * chunk : n;
		MR_UNROLL for (unsigned long long i = k * chunk; i < hi; i++) {
			long long r = mr_row(ids[i], offset, (long long)rows);
			if (r >= 0) p[(unsigned long long)r * d] += ld(dy, i * d + c);
		}
	}
}
MR_KERNEL void emb_part_f32(double *part, const float *dy, const float *ids, long long offset, unsigned long long rows, unsigned long long d, unsigned long long n, unsigned long long chunk) {
	emb_part(part, dy, ids, offset, rows, d, n, chunk);
}
MR_KERNEL void emb_part_bf16(double *part, const bf16 *dy, const float *ids, long long offset, unsigned long long rows, unsigned long long d, unsigned long long n, unsigned long long chunk) {
	emb_part(part, dy, ids, offset, rows, d, n, chunk);
}
MR_KERNEL void emb_sum(float *dtable, const double *part, unsigned long long rows, unsigned long long d, unsigned long long nk) {
	for (unsigned long long e = MR_TID; e < rows * d; e += MR_NTHREADS) {
		double s = 0;
		MR_UNROLL for (unsigned long long k = 0; k < nk; k++) s += part[k * rows * d + e];
		dtable[e] = (float)((double)dtable[e] + s);
	}
}

// stats[3t..] = (max, Σ exp(l − max), the target's logit or 0) per row of v
// logits (a vocabulary shard from offset).
template <class T>
__device__ static void cross_entropy(float *stats, const T *logits, const float *targets, long long offset,
		unsigned long long v, unsigned long long t) {
	for (unsigned long long i = MR_TID; i < t; i += MR_NTHREADS) {
		unsigned long long o = i * v;
		double top = -1.0 / 0.0;
		for (unsigned long long j = 0; j < v; j++) top = ld(logits, o + j) > top ? ld(logits, o + j) : top;
		double z = 0;
		for (unsigned long long j = 0; j < v; j++) z += mr_exp(ld(logits, o + j) - top);
		long long r = mr_row(targets[i], offset, (long long)v);
		stats[3 * i] = (float)top;
		stats[3 * i + 1] = (float)z;
		stats[3 * i + 2] = r < 0 ? 0.0f : ld(logits, o + (unsigned long long)r);
	}
}
MR_KERNEL void cross_entropy_f32(float *stats, const float *logits, const float *targets, long long offset,
		unsigned long long v, unsigned long long t) { cross_entropy(stats, logits, targets, offset, v, t); }
MR_KERNEL void cross_entropy_bf16(float *stats, const bf16 *logits, const float *targets, long long offset,
		unsigned long long v, unsigned long long t) { cross_entropy(stats, logits, targets, offset, v, t); }

// dlogits = scale·(exp(l − lse) − [column = target]).
template <class T>
__device__ static void cross_entropy_grad(T *dl, const T *logits, const float *targets, const float *lse, long long offset,
		unsigned long long v, unsigned long long t, double scale) {
	for (unsigned long long e = MR_TID; e < t * v; e += MR_NTHREADS) {
		unsigned long long i = e / v, j = e % v;
		float d = (float)(scale * mr_exp((double)ld(logits, e) - (double)lse[i]));
		if (mr_row(targets[i], offset, (long long)v) == (long long)j) d -= (float)scale;
		st(dl, e, d);
	}
}
MR_KERNEL void cross_entropy_grad_f32(float *dl, const float *logits, const float *targets, const float *lse, long long offset,
		unsigned long long v, unsigned long long t, double scale) { cross_entropy_grad(dl, logits, targets, lse, offset, v, t, scale); }
MR_KERNEL void cross_entropy_grad_bf16(bf16 *dl, const bf16 *logits, const float *targets, const float *lse, long long offset,
		unsigned long long v, unsigned long long t, double scale) { cross_entropy_grad(dl, logits, targets, lse, offset, v, t, scale); }

// lse[t] = the whole row's log-sum-exp from every shard's stats
// (stats[parts][rows][3]); part[t] = lse − the target's logit (in double),
// which sum_rows adds in row order.
MR_KERNEL void cross_entropy_combine(float *lse, double *part, const float *stats, unsigned long long parts, unsigned long long rows) {
	for (unsigned long long t = MR_TID; t < rows; t += MR_NTHREADS) {
		double top = -1.0 / 0.0, z = 0, picked = 0;
		for (unsigned long long q = 0; q < parts; q++) top = stats[(q * rows + t) * 3] > top ? stats[(q * rows + t) * 3] : top;
		for (unsigned long long q = 0; q < parts; q++) {
			const float *s = stats + (q * rows + t) * 3;
			z += (double)s[1] * mr_exp((double)s[0] - top);
			picked += s[2];
		}
		double l = top + mr_log(z);
		lse[t] = (float)l;
		part[t] = l - picked;
	}
}

// out[0] = Σ in[i] in order (one thread).
MR_KERNEL void sum_rows(double *out, const double *in, unsigned long long n) {
	if (MR_TID != 0) return;
	double acc = 0;
	for (unsigned long long i = 0; i < n; i++) acc += in[i];
	out[0] = acc;
}

// PyTorch's AdamW step on float32 param, grad and moments; decay = 1 −
// lr·wd, step = lr/(1 − β1^t), root = √(1 − β2^t), w1 = 1 − β1, b2 = β2.
MR_KERNEL void adamw_f32(float *param, const float *grad, float *m, float *v, unsigned long long n,
		float decay, float step, float root, float eps, float w1, float b2) {
	for (unsigned long long i = MR_TID; i < n; i += MR_NTHREADS) {
		float g = grad[i];
		float mi = m[i] + w1 * (g - m[i]);
		float vi = b2 * v[i] + (1 - b2) * g * g;
		m[i] = mi;
		v[i] = vi;
		float p = param[i] * decay;
		param[i] = p - step * mi / ((float)MR_SQRT((double)vi) / root + eps);
	}
}

// ---- Attention, one thread per query row (forward, dq) or key row (dk,
// dv): scores recomputed rather than kept, head dims up to MR_MAXD.
// Tensors are [batch, tokens, heads, width]: element c of row i of head h
// of batch b is at ((b·rows + i)·H + h)·width + c; a packed qkv is three
// such views (q, k and v offset by 0, E and 2E, width 3E).
#define MR_MAXD 256

typedef unsigned long long u64;

// score is q_i·k_t/√E, accumulated in float as a GEMM would.
template <class T>
__device__ static inline float attn_score(const T *q, const T *k, u64 qo, u64 ko, u64 E, float scale) {
	float s = 0;
	for (u64 c = 0; c < E; c++) s += ld(q, qo + c) * ld(k, ko + c);
	return s * scale;
}

// o = softmax(q·kᵀ/√E)·v per row, lse = the row's log-sum-exp (causal:
// keys t <= i).
template <class T>
__device__ static void attn_fwd(T *o, float *lse, const T *q, const T *k, const T *v, u64 B, u64 H, u64 S, u64 Tn,
		u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	float scale = (float)(1 / MR_SQRT((double)E));
	for (u64 w = MR_TID; w < B * H * S; w += MR_NTHREADS) {
		u64 i = w % S, bh = w / S, b = bh / H, h = bh % H;
		u64 nk = causal ? (i + 1 < Tn ? i + 1 : Tn) : Tn;
		u64 qo = ((b * S + i) * H + h) * qs;
		double top = -1.0 / 0.0, z = 0;
		for (u64 t = 0; t < nk; t++) {
			double s = attn_score(q, k, qo, ((b * Tn + t) * H + h) * ks, E, scale);
			top = s > top ? s : top;
		}
		for (u64 t = 0; t < nk; t++) z += mr_exp(attn_score(q, k, qo, ((b * Tn + t) * H + h) * ks, E, scale) - top);
		double m = top + mr_log(z);
		lse[bh * S + i] = (float)m;
		float acc[MR_MAXD];
		for (u64 c = 0; c < F; c++) acc[c] = 0;
		for (u64 t = 0; t < nk; t++) {
			float p = (float)mr_exp(attn_score(q, k, qo, ((b * Tn + t) * H + h) * ks, E, scale) - m);
			u64 vo = ((b * Tn + t) * H + h) * vs;
			for (u64 c = 0; c < F; c++) acc[c] += p * ld(v, vo + c);
		}
		u64 oo = ((b * S + i) * H + h) * F;
		for (u64 c = 0; c < F; c++) st(o, oo + c, acc[c]);
	}
}
MR_KERNEL void attn_fwd_f32(float *o, float *lse, const float *q, const float *k, const float *v, u64 B, u64 H, u64 S, u64 Tn,
		u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) { attn_fwd(o, lse, q, k, v, B, H, S, Tn, E, F, qs, ks, vs, causal); }
MR_KERNEL void attn_fwd_bf16(bf16 *o, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, u64 B, u64 H, u64 S, u64 Tn,
		u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) { attn_fwd(o, lse, q, k, v, B, H, S, Tn, E, F, qs, ks, vs, causal); }

// delta[row] = Σ do·o over the row (in double), for the backward.
template <class T>
__device__ static void attn_delta(double *delta, const T *dout, const T *o, u64 B, u64 H, u64 S, u64 F) {
	for (u64 w = MR_TID; w < B * H * S; w += MR_NTHREADS) {
		u64 i = w % S, bh = w / S, b = bh / H, h = bh % H;
		u64 oo = ((b * S + i) * H + h) * F;
		double d = 0;
		for (u64 c = 0; c < F; c++) d += (double)ld(dout, oo + c) * (double)ld(o, oo + c);
		delta[bh * S + i] = d;
	}
}
MR_KERNEL void attn_delta_f32(double *delta, const float *dout, const float *o, u64 B, u64 H, u64 S, u64 F) { attn_delta(delta, dout, o, B, H, S, F); }
MR_KERNEL void attn_delta_bf16(double *delta, const bf16 *dout, const bf16 *o, u64 B, u64 H, u64 S, u64 F) { attn_delta(delta, dout, o, B, H, S, F); }

// ds for query row i and key t: P ⊙ (do·v − delta)/√E, P from lse.
template <class T>
__device__ static inline float attn_ds(const T *q, const T *k, const T *v, const T *dout, const float *lse, const double *delta,
		u64 b, u64 h, u64 i, u64 t, u64 H, u64 S, u64 Tn, u64 E, u64 F, u64 qs, u64 ks, u64 vs, float scale, float *p) {
	u64 bh = b * H + h;
	*p = (float)mr_exp((double)attn_score(q, k, ((b * S + i) * H + h) * qs, ((b * Tn + t) * H + h) * ks, E, scale) - (double)lse[bh * S + i]);
	float dp = 0;
	u64 oo = ((b * S + i) * H + h) * F, vo = ((b * Tn + t) * H + h) * vs;
	for (u64 c = 0; c < F; c++) dp += ld(dout, oo + c) * ld(v, vo + c);
	return (float)((double)*p * ((double)dp - delta[bh * S + i]) * (double)scale);
}

// dq[i] = Σ_t ds·k_t, one thread per query row.
template <class T>
__device__ static void attn_dq(T *dq, const T *dout, const T *q, const T *k, const T *v, const float *lse, const double *delta,
		u64 B, u64 H, u64 S, u64 Tn, u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	float scale = (float)(1 / MR_SQRT((double)E));
	for (u64 w = MR_TID; w < B * H * S; w += MR_NTHREADS) {
		u64 i = w % S, bh = w / S, b = bh / H, h = bh % H;
		u64 nk = causal ? (i + 1 < Tn ? i + 1 : Tn) : Tn;
		float acc[MR_MAXD];
		for (u64 c = 0; c < E; c++) acc[c] = 0;
		for (u64 t = 0; t < nk; t++) {
			float p, ds = attn_ds(q, k, v, dout, lse, delta, b, h, i, t, H, S, Tn, E, F, qs, ks, vs, scale, &p);
			u64 ko = ((b * Tn + t) * H + h) * ks;
			for (u64 c = 0; c < E; c++) acc[c] += ds * ld(k, ko + c);
		}
		u64 qo = ((b * S + i) * H + h) * qs;
		for (u64 c = 0; c < E; c++) st(dq, qo + c, acc[c]);
	}
}
MR_KERNEL void attn_dq_f32(float *dq, const float *dout, const float *q, const float *k, const float *v, const float *lse, const double *delta,
		u64 B, u64 H, u64 S, u64 Tn, u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	attn_dq(dq, dout, q, k, v, lse, delta, B, H, S, Tn, E, F, qs, ks, vs, causal);
}
MR_KERNEL void attn_dq_bf16(bf16 *dq, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v, const float *lse, const double *delta,
		u64 B, u64 H, u64 S, u64 Tn, u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	attn_dq(dq, dout, q, k, v, lse, delta, B, H, S, Tn, E, F, qs, ks, vs, causal);
}

// dk[t] = Σ_i ds·q_i, dv[t] = Σ_i P·do_i, one thread per key row.
template <class T>
__device__ static void attn_dkv(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, const float *lse, const double *delta,
		u64 B, u64 H, u64 S, u64 Tn, u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	float scale = (float)(1 / MR_SQRT((double)E));
	for (u64 w = MR_TID; w < B * H * Tn; w += MR_NTHREADS) {
		u64 t = w % Tn, bh = w / Tn, b = bh / H, h = bh % H;
		float gk[MR_MAXD], gv[MR_MAXD];
		for (u64 c = 0; c < E; c++) gk[c] = 0;
		for (u64 c = 0; c < F; c++) gv[c] = 0;
		for (u64 i = causal ? t : 0; i < S; i++) {
			float p, ds = attn_ds(q, k, v, dout, lse, delta, b, h, i, t, H, S, Tn, E, F, qs, ks, vs, scale, &p);
			u64 qo = ((b * S + i) * H + h) * qs, oo = ((b * S + i) * H + h) * F;
			for (u64 c = 0; c < E; c++) gk[c] += ds * ld(q, qo + c);
			for (u64 c = 0; c < F; c++) gv[c] += p * ld(dout, oo + c);
		}
		u64 ko = ((b * Tn + t) * H + h) * ks, vo = ((b * Tn + t) * H + h) * vs;
		for (u64 c = 0; c < E; c++) st(dk, ko + c, gk[c]);
		for (u64 c = 0; c < F; c++) st(dv, vo + c, gv[c]);
	}
}
MR_KERNEL void attn_dkv_f32(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v, const float *lse,
		const double *delta, u64 B, u64 H, u64 S, u64 Tn, u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	attn_dkv(dk, dv, dout, q, k, v, lse, delta, B, H, S, Tn, E, F, qs, ks, vs, causal);
}
MR_KERNEL void attn_dkv_bf16(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v, const float *lse,
		const double *delta, u64 B, u64 H, u64 S, u64 Tn, u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	attn_dkv(dk, dv, dout, q, k, v, lse, delta, B, H, S, Tn, E, F, qs, ks, vs, causal);
}

// ---- Attention through GEMMs (the provider's cuBLAS path): the scores of
// one batch's heads, rows × Tn floats (row r is query r % S of its head),
// made probabilities here, in float32 whatever the data's dtype.

// The softmax of attention's scores in stages, as layer norm's: every
// thread on a slice, no loop over a whole row. A batch's rows (heads ×
// queries, each Tn scores) split into segments of seg keys.
//
// attn_smax_part: one thread per segment g of row r: the largest score in
// it (keys past the causal limit left out) and Σ exp(score − largest), in
// double, at part[2(r·ns+g)] and part[2(r·ns+g)+1]; −inf and 0 for a
// segment wholly past the limit.
MR_KERNEL void attn_smax_part(double *part, const float *sc, u64 rows, u64 S, u64 Tn, int causal, u64 seg) {
	u64 ns = (Tn + seg - 1) / seg;
	for (u64 e = MR_TID; e < rows * ns; e += MR_NTHREADS) {
		u64 r = e / ns, lo = (e % ns) * seg, i = r % S;
		u64 nk = causal ? (i + 1 < Tn ? i + 1 : Tn) : Tn;
		u64 hi = lo + seg < nk ? lo + seg : nk;
		const float *row = sc + r * Tn;
		double top = -1.0 / 0.0, z = 0;
		MR_UNROLL for (u64 t = lo; t < hi; t++) top = (double)row[t] > top ? (double)row[t] : top;
		MR_UNROLL for (u64 t = lo; t < hi; t++) z += mr_exp((double)row[t] - top);
		part[2 * e] = top;
		part[2 * e + 1] = z;
	}
}

// attn_smax_lse: one thread per row: lse[r] = log Σ exp(score) over the row,
// from its segments' parts in order.
MR_KERNEL void attn_smax_lse(float *lse, const double *part, u64 rows, u64 ns) {
	for (u64 r = MR_TID; r < rows; r += MR_NTHREADS) {
		const double *p = part + 2 * r * ns;
		double top = -1.0 / 0.0, z = 0;
		for (u64 g = 0; g < ns; g++) top = p[2 * g] > top ? p[2 * g] : top;
		for (u64 g = 0; g < ns; g++) {
			if (p[2 * g + 1] > 0) z += p[2 * g + 1] * mr_exp(p[2 * g] - top);
		}
		lse[r] = (float)(top + mr_log(z));
	}
}

// attn_smax_exp: one thread per score: the score becomes its probability
// exp(score − lse[row]) in place, 0 past the causal limit, and where p16 is
// not null, its bfloat16 rounding there too (the bfloat16 path's P·v and
// Pᵀ·do take it). The forward and the backward's recompute both take lse as
// stored (float).
MR_KERNEL void attn_smax_exp(float *sc, bf16 *p16, const float *lse, u64 rows, u64 S, u64 Tn, int causal) {
	for (u64 e = MR_TID; e < rows * Tn; e += MR_NTHREADS) {
		u64 r = e / Tn, t = e % Tn, i = r % S;
		u64 nk = causal ? (i + 1 < Tn ? i + 1 : Tn) : Tn;
		float p = t < nk ? (float)mr_exp((double)sc[e] - (double)lse[r]) : 0.0f;
		sc[e] = p;
		if (p16) p16[e] = f2bf(p);
	}
}

// attn_ds: ds = P ⊙ (dP − delta[row])·scale in place of dP, one thread per
// element of rows × Tn, and where ds16 is not null its bfloat16 rounding
// there too (the bfloat16 path's dq and dk GEMMs take it).
MR_KERNEL void attn_ds_f32(float *ds, bf16 *ds16, const float *p, const double *delta, u64 rows, u64 Tn, float scale) {
	for (u64 e = MR_TID; e < rows * Tn; e += MR_NTHREADS) {
		float v = (float)((double)p[e] * ((double)ds[e] - delta[e / Tn]) * (double)scale);
		ds[e] = v;
		if (ds16) ds16[e] = f2bf(v);
	}
}

// ---- Layer norm in stages, every thread on a slice (no row or column
// loop over a whole dimension): rows split into segments of seg columns,
// columns into chunks of chunk rows, the partial sums (double) kept in a
// scratch and combined in a fixed order. y = (x − mean)·rstd·gamma + beta
// per row (stats[2r], stats[2r+1] = mean, rstd; the variance of the
// centred values); dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·gamma;
// dgamma (+)= Σ_rows dy·x̂, dbeta (+)= Σ_rows dy.

// ln_part: part[r·ns + s] = Σ x over segment s of row r, or with mean
// given, Σ (x − mean[r])².
template <class T>
__device__ static void ln_part(double *part, const T *x, const double *mean, u64 rows, u64 d, u64 seg) {
	u64 ns = (d + seg - 1) / seg;
	for (u64 e = MR_TID; e < rows * ns; e += MR_NTHREADS) {
		u64 r = e / ns, lo = (e % ns) * seg, hi = lo + seg < d ? lo + seg : d;
		double a = 0;
		if (mean) {
			double m = mean[r];
			MR_UNROLL for (u64 i = lo; i < hi; i++) {
				double c = ld(x, r * d + i) - m;
				a += c * c;
			}
		} else {
			MR_UNROLL for (u64 i = lo; i < hi; i++) a += ld(x, r * d + i);
		}
		part[e] = a;
	}
}
MR_KERNEL void ln_part_f32(double *part, const float *x, const double *mean, u64 rows, u64 d, u64 seg) { ln_part(part, x, mean, rows, d, seg); }
MR_KERNEL void ln_part_bf16(double *part, const bf16 *x, const double *mean, u64 rows, u64 d, u64 seg) { ln_part(part, x, mean, rows, d, seg); }

// ln_row: per row, from its ns partial sums: given no mean, mean[r] = Σ/d;
// else stats[2r], stats[2r+1] = mean, 1/√(Σ/d + eps).
MR_KERNEL void ln_row(double *mean, float *stats, const double *part, u64 rows, u64 d, u64 ns, int rstd, double eps) {
	for (u64 r = MR_TID; r < rows; r += MR_NTHREADS) {
		double a = 0;
		for (u64 s = 0; s < ns; s++) a += part[r * ns + s];
		if (rstd) {
			stats[2 * r] = (float)mean[r];
			stats[2 * r + 1] = (float)(1 / MR_SQRT(a / (double)d + eps));
		} else {
			mean[r] = a / (double)d;
		}
	}
}

// ln_apply: y = (x − mean)·rstd·gamma + beta, one thread per element.
template <class T>
__device__ static void ln_apply(T *y, const float *stats, const T *x, const T *gamma, const T *beta, u64 rows, u64 d) {
	for (u64 e = MR_TID; e < rows * d; e += MR_NTHREADS) {
		u64 r = e / d, i = e % d;
		st(y, e, (ld(x, e) - stats[2 * r]) * stats[2 * r + 1] * ld(gamma, i) + (beta ? ld(beta, i) : 0.0f));
	}
}
MR_KERNEL void ln_apply_f32(float *y, const float *stats, const float *x, const float *gamma, const float *beta, u64 rows, u64 d) {
	ln_apply(y, stats, x, gamma, beta, rows, d);
}
MR_KERNEL void ln_apply_bf16(bf16 *y, const float *stats, const bf16 *x, const bf16 *gamma, const bf16 *beta, u64 rows, u64 d) {
	ln_apply(y, stats, x, gamma, beta, rows, d);
}

// ln_dx_part: part[2(r·ns + s)], part[2(r·ns + s) + 1] = Σ g, Σ g·x̂ over
// segment s of row r, g = dy·gamma (as layer_norm_dx).
template <class T>
__device__ static void ln_dx_part(double *part, const T *dy, const T *x, const T *gamma, const float *stats, u64 rows, u64 d, u64 seg) {
	u64 ns = (d + seg - 1) / seg;
	for (u64 e = MR_TID; e < rows * ns; e += MR_NTHREADS) {
		u64 r = e / ns, lo = (e % ns) * seg, hi = lo + seg < d ? lo + seg : d;
		float m = stats[2 * r], s = stats[2 * r + 1];
		double m1 = 0, m2 = 0;
		MR_UNROLL for (u64 i = lo; i < hi; i++) {
			float g = ld(dy, r * d + i) * ld(gamma, i);
			m1 += g;
			m2 += (double)g * (double)((ld(x, r * d + i) - m) * s);
		}
		part[2 * e] = m1;
		part[2 * e + 1] = m2;
	}
}
MR_KERNEL void ln_dx_part_f32(double *part, const float *dy, const float *x, const float *gamma, const float *stats, u64 rows, u64 d, u64 seg) {
	ln_dx_part(part, dy, x, gamma, stats, rows, d, seg);
}
MR_KERNEL void ln_dx_part_bf16(double *part, const bf16 *dy, const bf16 *x, const bf16 *gamma, const float *stats, u64 rows, u64 d, u64 seg) {
	ln_dx_part(part, dy, x, gamma, stats, rows, d, seg);
}

// ln_dx_apply: dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), one thread per
// element, the row's means from its ns partial sums.
template <class T>
__device__ static void ln_dx_apply(T *dx, const T *dy, const T *x, const T *gamma, const float *stats, const double *part,
		u64 rows, u64 d, u64 ns) {
	for (u64 e = MR_TID; e < rows * d; e += MR_NTHREADS) {
		u64 r = e / d, i = e % d;
		double m1 = 0, m2 = 0;
		for (u64 s = 0; s < ns; s++) {
			m1 += part[2 * (r * ns + s)];
			m2 += part[2 * (r * ns + s) + 1];
		}
		float m = stats[2 * r], s = stats[2 * r + 1];
		float a = (float)(m1 / (double)d), b = (float)(m2 / (double)d);
		st(dx, e, s * (ld(dy, e) * ld(gamma, i) - a - (ld(x, e) - m) * s * b));
	}
}
MR_KERNEL void ln_dx_apply_f32(float *dx, const float *dy, const float *x, const float *gamma, const float *stats, const double *part,
		u64 rows, u64 d, u64 ns) { ln_dx_apply(dx, dy, x, gamma, stats, part, rows, d, ns); }
MR_KERNEL void ln_dx_apply_bf16(bf16 *dx, const bf16 *dy, const bf16 *x, const bf16 *gamma, const float *stats, const double *part,
		u64 rows, u64 d, u64 ns) { ln_dx_apply(dx, dy, x, gamma, stats, part, rows, d, ns); }

// ln_dgb_part: part[2(c·d + i)], part[2(c·d + i) + 1] = Σ dy·x̂, Σ dy over
// chunk c of rows, column i.
template <class T>
__device__ static void ln_dgb_part(double *part, const T *dy, const T *x, const float *stats, u64 rows, u64 d, u64 chunk) {
	u64 nc = (rows + chunk - 1) / chunk;
	for (u64 e = MR_TID; e < nc * d; e += MR_NTHREADS) {
		u64 c = e / d, i = e % d, lo = c * chunk, hi = lo + chunk < rows ? lo + chunk : rows;
		double g = 0, b = 0;
		MR_UNROLL for (u64 r = lo; r < hi; r++) {
			double v = ld(dy, r * d + i);
			g += v * (double)((ld(x, r * d + i) - stats[2 * r]) * stats[2 * r + 1]);
			b += v;
		}
		part[2 * e] = g;
		part[2 * e + 1] = b;
	}
}
MR_KERNEL void ln_dgb_part_f32(double *part, const float *dy, const float *x, const float *stats, u64 rows, u64 d, u64 chunk) {
	ln_dgb_part(part, dy, x, stats, rows, d, chunk);
}
MR_KERNEL void ln_dgb_part_bf16(double *part, const bf16 *dy, const bf16 *x, const float *stats, u64 rows, u64 d, u64 chunk) {
	ln_dgb_part(part, dy, x, stats, rows, d, chunk);
}

// ln_dgb_sum: dgamma (+)= Σ_chunks, dbeta (+)= Σ_chunks, per column (either
// may be null).
template <class T>
__device__ static void ln_dgb_sum(T *dgamma, T *dbeta, const double *part, u64 nc, u64 d, int accumulate) {
	for (u64 i = MR_TID; i < d; i += MR_NTHREADS) {
		double g = 0, b = 0;
		for (u64 c = 0; c < nc; c++) {
			g += part[2 * (c * d + i)];
			b += part[2 * (c * d + i) + 1];
		}
		if (dgamma) st(dgamma, i, (accumulate ? ld(dgamma, i) : 0.0f) + (float)g);
		if (dbeta) st(dbeta, i, (accumulate ? ld(dbeta, i) : 0.0f) + (float)b);
	}
}
MR_KERNEL void ln_dgb_sum_f32(float *dgamma, float *dbeta, const double *part, u64 nc, u64 d, int accumulate) {
	ln_dgb_sum(dgamma, dbeta, part, nc, d, accumulate);
}
MR_KERNEL void ln_dgb_sum_bf16(bf16 *dgamma, bf16 *dbeta, const double *part, u64 nc, u64 d, int accumulate) {
	ln_dgb_sum(dgamma, dbeta, part, nc, d, accumulate);
}

// ---- Layer norm a block per row (MR_LNT threads, each on every
// MR_LNT-th column; a row's sums in double, added in a fixed tree in
// shared memory): one launch for y and the statistics, one for dx, as the
// staged kernels compute them (dgamma and dbeta stay staged: sums over
// rows).
#define MR_LNT 256

// mr_block_sum is the block's sum of each thread's v, in a fixed order (a
// tree over red, MR_LNT doubles of shared memory), for every thread.
__device__ static inline double mr_block_sum(double *red, double v, unsigned tx) {
	red[tx] = v;
	MR_SYNC();
	for (unsigned w = MR_LNT / 2; w > 0; w /= 2) {
		if (tx < w) red[tx] += red[tx + w];
		MR_SYNC();
	}
	double s = red[0];
	MR_SYNC(); // every thread has read it before red is written again
	return s;
}

// ln_block: row MR_BID's mean, the sum of its centred squares, stats[2r],
// stats[2r+1] = mean, 1/√(Σ/d + eps), then y = (x − mean)·rstd·gamma + beta.
template <class T>
__device__ static inline __attribute__((always_inline)) void ln_block(T *y, float *stats, const T *x, const T *gamma, const T *beta,
		u64 d, double eps) {
	MR_SHARED double red[MR_LNT];
	u64 r = MR_BID, row = r * d;
	unsigned tx = MR_TX;
	double a = 0;
	for (u64 i = tx; i < d; i += MR_LNT) a += ld(x, row + i);
	double mean = mr_block_sum(red, a, tx) / (double)d;
	a = 0;
	for (u64 i = tx; i < d; i += MR_LNT) {
		double c = ld(x, row + i) - mean;
		a += c * c;
	}
	double var = mr_block_sum(red, a, tx);
	float m = (float)mean, rs = (float)(1 / MR_SQRT(var / (double)d + eps));
	if (tx == 0) {
		stats[2 * r] = m;
		stats[2 * r + 1] = rs;
	}
	for (u64 i = tx; i < d; i += MR_LNT) st(y, row + i, (ld(x, row + i) - m) * rs * ld(gamma, i) + (beta ? ld(beta, i) : 0.0f));
}
MR_KERNEL void ln_block_f32(float *y, float *stats, const float *x, const float *gamma, const float *beta, u64 d, double eps) {
	ln_block(y, stats, x, gamma, beta, d, eps);
}
MR_KERNEL void ln_block_bf16(bf16 *y, float *stats, const bf16 *x, const bf16 *gamma, const bf16 *beta, u64 d, double eps) {
	ln_block(y, stats, x, gamma, beta, d, eps);
}

// ln_dx_block: row MR_BID's Σ g and Σ g·x̂ (g = dy·gamma), then dx =
// rstd·(g − mean(g) − x̂·mean(g·x̂)).
template <class T>
__device__ static inline __attribute__((always_inline)) void ln_dx_block(T *dx, const T *dy, const T *x, const T *gamma,
		const float *stats, u64 d) {
	MR_SHARED double red[MR_LNT];
	u64 r = MR_BID, row = r * d;
	unsigned tx = MR_TX;
	float m = stats[2 * r], s = stats[2 * r + 1];
	double m1 = 0, m2 = 0;
	for (u64 i = tx; i < d; i += MR_LNT) {
		float g = ld(dy, row + i) * ld(gamma, i);
		m1 += g;
		m2 += (double)g * (double)((ld(x, row + i) - m) * s);
	}
	float a = (float)(mr_block_sum(red, m1, tx) / (double)d), b = (float)(mr_block_sum(red, m2, tx) / (double)d);
	for (u64 i = tx; i < d; i += MR_LNT) st(dx, row + i, s * (ld(dy, row + i) * ld(gamma, i) - a - (ld(x, row + i) - m) * s * b));
}
MR_KERNEL void ln_dx_block_f32(float *dx, const float *dy, const float *x, const float *gamma, const float *stats, u64 d) {
	ln_dx_block(dx, dy, x, gamma, stats, d);
}
MR_KERNEL void ln_dx_block_bf16(bf16 *dx, const bf16 *dy, const bf16 *x, const bf16 *gamma, const float *stats, u64 d) {
	ln_dx_block(dx, dy, x, gamma, stats, d);
}

// ---- Attention fused (flash attention's order, without tensor cores):
// a block of threads per tile of rows, each thread one row, tiles of the
// other side staged in shared memory; the scores never leave the block.
// Head dims up to MR_FD (shorter ones padded with zeros in shared memory,
// so the loops run MR_FD long and unroll). Tensors and lse as above.
#define MR_FD 64
#define MR_FQ 64 // query rows of a forward block
#define MR_FB 32 // rows of a backward block, and of every staged tile

// mr_dot is a·b over MR_FD floats in four interleaved partial sums, so
// that four chains of multiply-adds are in flight rather than one.
__device__ static inline float mr_dot(const float *a, const float *b) {
	float p[4] = {0, 0, 0, 0};
	MR_UNROLL_ALL for (int c = 0; c < MR_FD; c++) p[c % 4] += a[c] * b[c];
	return (p[0] + p[1]) + (p[2] + p[3]);
}

// mr_logf is ln x for x > 0 (through mr_log).
__device__ static inline float mr_logf(float x) { return (float)mr_log((double)x); }

// attn_tile stages rows r0.. of a [batch, tokens, heads, width] tensor's
// head (b, h) into sh (rows × MR_FD floats, pitch floats a row), zeros
// past the tensor's rows or width; the block's nt threads each take every
// nt-th element, so that consecutive threads read consecutive columns.
template <class T>
__device__ static inline void attn_tile(float *sh, u64 pitch, u64 rows, const T *x, u64 b, u64 h, u64 r0, u64 n, u64 H, u64 w,
		u64 stride, unsigned tx, unsigned nt) {
	for (u64 e = tx; e < rows * MR_FD; e += nt) {
		u64 r = e / MR_FD, c = e % MR_FD, t = r0 + r;
		sh[r * pitch + c] = t < n && c < w ? ld(x, ((b * n + t) * H + h) * stride + c) : 0.0f;
	}
}

// attn_flash_fwd: block (b, h, tile of MR_FQ queries), MR_FQ threads. Per
// tile of MR_FB keys: each thread's scores (kept in shared memory, a row a
// thread), their largest, the running maximum m and sum l rescaled, acc +=
// p·v; o = acc/l, lse = m + ln l.
template <class T>
__device__ static inline __attribute__((always_inline)) void attn_flash_fwd(T *o, float *lse, const T *q, const T *k, const T *v, u64 B, u64 H, u64 S, u64 Tn,
		u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	MR_SHARED float qsh[MR_FQ * (MR_FD + 1)];
	MR_SHARED float ksh[MR_FB * MR_FD];
	MR_SHARED float vsh[MR_FB * MR_FD];
	MR_SHARED float ssh[MR_FQ * (MR_FB + 1)]; // each thread's scores of the tile
	u64 nqb = (S + MR_FQ - 1) / MR_FQ, blk = MR_BID, bh = blk / nqb, q0 = (blk % nqb) * MR_FQ, b = bh / H, h = bh % H;
	unsigned tx = MR_TX;
	u64 i = q0 + tx;
	bool live = i < S;
	float scale = (float)(1 / MR_SQRT((double)E));
	attn_tile(qsh, MR_FD + 1, MR_FQ, q, b, h, q0, S, H, E, qs, tx, MR_FQ);
	float acc[MR_FD];
	MR_UNROLL_ALL for (int c = 0; c < MR_FD; c++) acc[c] = 0;
	float m = -1.0f / 0.0f, l = 0;
	u64 kend = Tn;
	if (causal && q0 + MR_FQ < kend) kend = q0 + MR_FQ;
	for (u64 t0 = 0; t0 < kend; t0 += MR_FB) {
		MR_SYNC(); // the last tile's readers are done (and q is staged)
		attn_tile(ksh, MR_FD, MR_FB, k, b, h, t0, Tn, H, E, ks, tx, MR_FQ);
		attn_tile(vsh, MR_FD, MR_FB, v, b, h, t0, Tn, H, F, vs, tx, MR_FQ);
		MR_SYNC();
		if (!live) continue;
		float *sc = ssh + tx * (MR_FB + 1), top = -1.0f / 0.0f;
		for (int j = 0; j < MR_FB; j++) {
			u64 t = t0 + j;
			float x = -1.0f / 0.0f;
			if (t < Tn && (!causal || t <= i)) {
				x = mr_dot(qsh + tx * (MR_FD + 1), ksh + j * MR_FD) * scale;
			}
			sc[j] = x;
			top = x > top ? x : top;
		}
		if (top == -1.0f / 0.0f) continue; // every key of the tile masked
		float mn = top > m ? top : m, corr = mr_expf(m - mn);
		l *= corr;
		MR_UNROLL_ALL for (int c = 0; c < MR_FD; c++) acc[c] *= corr;
		for (int j = 0; j < MR_FB; j++) {
			float p = mr_expf(sc[j] - mn);
			l += p;
			MR_UNROLL_ALL for (int c = 0; c < MR_FD; c++) acc[c] += p * vsh[j * MR_FD + c];
		}
		m = mn;
	}
	if (!live) return;
	lse[bh * S + i] = m + mr_logf(l);
	u64 oo = ((b * S + i) * H + h) * F;
	MR_UNROLL_ALL for (int c = 0; c < MR_FD; c++)
		if ((u64)c < F) st(o, oo + c, acc[c] / l);
}
MR_KERNEL void attn_flash_fwd_f32(float *o, float *lse, const float *q, const float *k, const float *v, u64 B, u64 H, u64 S, u64 Tn,
		u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) { attn_flash_fwd(o, lse, q, k, v, B, H, S, Tn, E, F, qs, ks, vs, causal); }
MR_KERNEL void attn_flash_fwd_bf16(bf16 *o, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, u64 B, u64 H, u64 S, u64 Tn,
		u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) { attn_flash_fwd(o, lse, q, k, v, B, H, S, Tn, E, F, qs, ks, vs, causal); }

// attn_flash_dq: block (b, h, tile of MR_FB queries), MR_FB threads, each
// query's q and do in shared memory (a row a thread, padded against bank
// conflicts); per tile of keys: p = exp(s − lse), ds = p·(do·v − delta)/√E,
// dq += ds·k.
template <class T>
__device__ static inline __attribute__((always_inline)) void attn_flash_dq(T *dq, const T *dout, const T *q, const T *k, const T *v, const float *lse, const double *delta,
		u64 B, u64 H, u64 S, u64 Tn, u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	MR_SHARED float qsh[MR_FB * (MR_FD + 1)];
	MR_SHARED float dsh[MR_FB * (MR_FD + 1)];
	MR_SHARED float ksh[MR_FB * MR_FD];
	MR_SHARED float vsh[MR_FB * MR_FD];
	u64 nqb = (S + MR_FB - 1) / MR_FB, blk = MR_BID, bh = blk / nqb, q0 = (blk % nqb) * MR_FB, b = bh / H, h = bh % H;
	unsigned tx = MR_TX;
	u64 i = q0 + tx;
	bool live = i < S;
	float scale = (float)(1 / MR_SQRT((double)E));
	attn_tile(qsh, MR_FD + 1, MR_FB, q, b, h, q0, S, H, E, qs, tx, MR_FB);
	attn_tile(dsh, MR_FD + 1, MR_FB, dout, b, h, q0, S, H, F, F, tx, MR_FB);
	float li = live ? lse[bh * S + i] : 0, di = live ? (float)delta[bh * S + i] : 0;
	float acc[MR_FD];
	MR_UNROLL_ALL for (int c = 0; c < MR_FD; c++) acc[c] = 0;
	u64 kend = Tn;
	if (causal && q0 + MR_FB < kend) kend = q0 + MR_FB;
	const float *qi = qsh + tx * (MR_FD + 1), *di_ = dsh + tx * (MR_FD + 1);
	for (u64 t0 = 0; t0 < kend; t0 += MR_FB) {
		MR_SYNC();
		attn_tile(ksh, MR_FD, MR_FB, k, b, h, t0, Tn, H, E, ks, tx, MR_FB);
		attn_tile(vsh, MR_FD, MR_FB, v, b, h, t0, Tn, H, F, vs, tx, MR_FB);
		MR_SYNC();
		if (!live) continue;
		for (int j = 0; j < MR_FB; j++) {
			u64 t = t0 + j;
			if (t >= Tn || (causal && t > i)) continue;
			float s = mr_dot(qi, ksh + j * MR_FD), dp = mr_dot(di_, vsh + j * MR_FD);
			float p = mr_expf(s * scale - li), ds = p * (dp - di) * scale;
			MR_UNROLL_ALL for (int c = 0; c < MR_FD; c++) acc[c] += ds * ksh[j * MR_FD + c];
		}
	}
	if (!live) return;
	u64 qo = ((b * S + i) * H + h) * qs;
	MR_UNROLL_ALL for (int c = 0; c < MR_FD; c++)
		if ((u64)c < E) st(dq, qo + c, acc[c]);
}
MR_KERNEL void attn_flash_dq_f32(float *dq, const float *dout, const float *q, const float *k, const float *v, const float *lse,
		const double *delta, u64 B, u64 H, u64 S, u64 Tn, u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	attn_flash_dq(dq, dout, q, k, v, lse, delta, B, H, S, Tn, E, F, qs, ks, vs, causal);
}
MR_KERNEL void attn_flash_dq_bf16(bf16 *dq, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v, const float *lse,
		const double *delta, u64 B, u64 H, u64 S, u64 Tn, u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	attn_flash_dq(dq, dout, q, k, v, lse, delta, B, H, S, Tn, E, F, qs, ks, vs, causal);
}

// attn_flash_dkv: block (b, h, tile of MR_FB keys), MR_FB threads, each
// key's k and v in shared memory (padded); per tile of queries (from the
// block's first key on when causal): dv += p·do, dk += ds·q.
template <class T>
__device__ static inline __attribute__((always_inline)) void attn_flash_dkv(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v, const float *lse,
		const double *delta, u64 B, u64 H, u64 S, u64 Tn, u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	MR_SHARED float ksh[MR_FB * (MR_FD + 1)];
	MR_SHARED float vsh[MR_FB * (MR_FD + 1)];
	MR_SHARED float qsh[MR_FB * MR_FD];
	MR_SHARED float dsh[MR_FB * MR_FD];
	MR_SHARED float lsh[MR_FB];
	MR_SHARED float tsh[MR_FB];
	u64 nkb = (Tn + MR_FB - 1) / MR_FB, blk = MR_BID, bh = blk / nkb, k0 = (blk % nkb) * MR_FB, b = bh / H, h = bh % H;
	unsigned tx = MR_TX;
	u64 t = k0 + tx;
	bool live = t < Tn;
	float scale = (float)(1 / MR_SQRT((double)E));
	attn_tile(ksh, MR_FD + 1, MR_FB, k, b, h, k0, Tn, H, E, ks, tx, MR_FB);
	attn_tile(vsh, MR_FD + 1, MR_FB, v, b, h, k0, Tn, H, F, vs, tx, MR_FB);
	float gk[MR_FD], gv[MR_FD];
	MR_UNROLL_ALL for (int c = 0; c < MR_FD; c++) gk[c] = gv[c] = 0;
	const float *kt = ksh + tx * (MR_FD + 1), *vt = vsh + tx * (MR_FD + 1);
	for (u64 i0 = causal ? k0 : 0; i0 < S; i0 += MR_FB) {
		MR_SYNC();
		attn_tile(qsh, MR_FD, MR_FB, q, b, h, i0, S, H, E, qs, tx, MR_FB);
		attn_tile(dsh, MR_FD, MR_FB, dout, b, h, i0, S, H, F, F, tx, MR_FB);
		lsh[tx] = i0 + tx < S ? lse[bh * S + i0 + tx] : 0;
		tsh[tx] = i0 + tx < S ? (float)delta[bh * S + i0 + tx] : 0;
		MR_SYNC();
		if (!live) continue;
		for (int r = 0; r < MR_FB; r++) {
			u64 i = i0 + r;
			if (i >= S || (causal && t > i)) continue;
			float s = mr_dot(qsh + r * MR_FD, kt), dp = mr_dot(dsh + r * MR_FD, vt);
			float p = mr_expf(s * scale - lsh[r]), ds = p * (dp - tsh[r]) * scale;
			MR_UNROLL_ALL for (int c = 0; c < MR_FD; c++) {
				gv[c] += p * dsh[r * MR_FD + c];
				gk[c] += ds * qsh[r * MR_FD + c];
			}
		}
	}
	if (!live) return;
	u64 ko = ((b * Tn + t) * H + h) * ks, vo = ((b * Tn + t) * H + h) * vs;
	MR_UNROLL_ALL for (int c = 0; c < MR_FD; c++) {
		if ((u64)c < E) st(dk, ko + c, gk[c]);
		if ((u64)c < F) st(dv, vo + c, gv[c]);
	}
}
MR_KERNEL void attn_flash_dkv_f32(float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v, const float *lse,
		const double *delta, u64 B, u64 H, u64 S, u64 Tn, u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	attn_flash_dkv(dk, dv, dout, q, k, v, lse, delta, B, H, S, Tn, E, F, qs, ks, vs, causal);
}
MR_KERNEL void attn_flash_dkv_bf16(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v, const float *lse,
		const double *delta, u64 B, u64 H, u64 S, u64 Tn, u64 E, u64 F, u64 qs, u64 ks, u64 vs, int causal) {
	attn_flash_dkv(dk, dv, dout, q, k, v, lse, delta, B, H, S, Tn, E, F, qs, ks, vs, causal);
}
