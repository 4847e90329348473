//go:build cudaemu

// Host emulation of the provider's CUDA kernels (build tag cudaemu): each
// kernel's threads run one after another on the CPU; the block kernels
// (the fused attention's) a block at a time, its threads together.
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels.h"
#include "emu.h"

thread_local unsigned mr_tid, mr_nthreads, mr_tx, mr_bid;

// The running block's barrier: MR_SYNC waits until all its threads arrive.
// With an order (emu_set_order), the threads take turns instead: one runs
// at a time, from its barrier (or its start) to the next, in ascending or
// descending MR_TX, so that a read of shared memory that a missing barrier
// leaves racing reads the writer's value in one order and the old one in
// the other.
static struct {
	std::mutex mu;
	std::condition_variable cv;
	unsigned n, waiting, gen;
	unsigned turn;                     // the position in the order whose turn it is
	std::condition_variable turns[1024]; // each position's: woken alone
} mr_bar;
static int mr_order; // 0: threads free; 1: in turn, ascending; 2: descending

void emu_set_order(int order) { mr_order = order; }

static unsigned mr_pos() { return mr_order == 2 ? mr_bar.n - 1 - mr_tx : mr_tx; }

// mr_pass gives the turn to the next thread in the order, the first again
// after the last (the barrier's phase is over); the caller holds mu.
static void mr_pass() {
	if (++mr_bar.turn == mr_bar.n) mr_bar.turn = 0;
	mr_bar.turns[mr_bar.turn].notify_one();
}

static void mr_wait_turn(std::unique_lock<std::mutex> &l) {
	unsigned me = mr_pos();
	mr_bar.turns[me].wait(l, [me] { return mr_bar.turn == me; });
}

void mr_sync() {
	std::unique_lock<std::mutex> l(mr_bar.mu);
	if (mr_order) {
		mr_pass();
		mr_wait_turn(l);
		return;
	}
	unsigned g = mr_bar.gen;
	if (++mr_bar.waiting == mr_bar.n) {
		mr_bar.waiting = 0;
		mr_bar.gen++;
		mr_bar.cv.notify_all();
		return;
	}
	mr_bar.cv.wait(l, [&] { return mr_bar.gen != g; });
}

// blocks runs nb blocks of nt threads one block after another, each
// block's threads as OS threads (MR_TX, MR_BID set; MR_SHARED's statics
// are the block's shared memory). One block kernel at a time.
static std::mutex mr_blocks;
template <class F> static void blocks(unsigned long long nb, unsigned nt, F f) {
	std::lock_guard<std::mutex> one(mr_blocks);
	for (unsigned long long b = 0; b < nb; b++) {
		mr_bar.n = nt;
		mr_bar.waiting = 0;
		mr_bar.turn = 0;
		std::vector<std::thread> ts;
		for (unsigned t = 0; t < nt; t++) ts.emplace_back([&f, b, t] {
			mr_tx = t;
			mr_bid = (unsigned)b;
			if (mr_order) {
				std::unique_lock<std::mutex> l(mr_bar.mu);
				mr_wait_turn(l);
			}
			f();
			if (mr_order) {
				std::lock_guard<std::mutex> l(mr_bar.mu);
				mr_pass();
			}
		});
		for (auto &t : ts) t.join();
	}
}

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

// The bias gradient's two stages, as the provider launches them: chunks of
// chunk rows, then each column's chunks.
void emu_bias_grad_bf16(void *db, int db32, const void *dy, unsigned long long m, unsigned long long n, int accumulate,
		unsigned long long chunk, unsigned threads) {
	unsigned long long nc = (m + chunk - 1) / chunk;
	std::vector<double> part(nc * n + 1);
	grid(threads, [&] { bias_part_bf16(part.data(), (const bf16 *)dy, m, n, chunk); });
	grid(threads, [&] { db32 ? bias_sum_bf16_f32((float *)db, part.data(), nc, n, accumulate) : bias_sum_bf16((bf16 *)db, part.data(), nc, n, accumulate); });
}

// The layer norm's stages, as the provider launches them: rows in segments
// of seg columns, columns in chunks of chunk rows.
void emu_layer_norm(int bf, void *y, float *stats, const void *x, const void *gamma, const void *beta,
		unsigned long long rows, unsigned long long d, double eps, unsigned long long seg, unsigned threads) {
	unsigned long long ns = (d + seg - 1) / seg;
	std::vector<double> part(rows * ns + 1), mean(rows + 1);
	for (int pass = 0; pass < 2; pass++) {
		const double *m = pass ? mean.data() : nullptr;
		grid(threads, [&] {
			bf ? ln_part_bf16(part.data(), (const bf16 *)x, m, rows, d, seg) : ln_part_f32(part.data(), (const float *)x, m, rows, d, seg);
		});
		grid(threads, [&] { ln_row(mean.data(), stats, part.data(), rows, d, ns, pass, eps); });
	}
	grid(threads, [&] {
		bf ? ln_apply_bf16((bf16 *)y, stats, (const bf16 *)x, (const bf16 *)gamma, (const bf16 *)beta, rows, d)
		   : ln_apply_f32((float *)y, stats, (const float *)x, (const float *)gamma, (const float *)beta, rows, d);
	});
}

void emu_layer_norm_block(int bf, void *y, float *stats, const void *x, const void *gamma, const void *beta,
		unsigned long long rows, unsigned long long d, double eps) {
	blocks(rows, MR_LNT, [&] {
		bf ? ln_block_bf16((bf16 *)y, stats, (const bf16 *)x, (const bf16 *)gamma, (const bf16 *)beta, d, eps)
		   : ln_block_f32((float *)y, stats, (const float *)x, (const float *)gamma, (const float *)beta, d, eps);
	});
}

void emu_layer_norm_dx_block(int bf, void *dx, const void *dy, const void *x, const void *gamma, const float *stats,
		unsigned long long rows, unsigned long long d) {
	blocks(rows, MR_LNT, [&] {
		bf ? ln_dx_block_bf16((bf16 *)dx, (const bf16 *)dy, (const bf16 *)x, (const bf16 *)gamma, stats, d)
		   : ln_dx_block_f32((float *)dx, (const float *)dy, (const float *)x, (const float *)gamma, stats, d);
	});
}

void emu_layer_norm_dx(int bf, void *dx, const void *dy, const void *x, const void *gamma, const float *stats,
		unsigned long long rows, unsigned long long d, unsigned long long seg, unsigned threads) {
	unsigned long long ns = (d + seg - 1) / seg;
	std::vector<double> part(2 * rows * ns + 1);
	grid(threads, [&] {
		bf ? ln_dx_part_bf16(part.data(), (const bf16 *)dy, (const bf16 *)x, (const bf16 *)gamma, stats, rows, d, seg)
		   : ln_dx_part_f32(part.data(), (const float *)dy, (const float *)x, (const float *)gamma, stats, rows, d, seg);
	});
	grid(threads, [&] {
		bf ? ln_dx_apply_bf16((bf16 *)dx, (const bf16 *)dy, (const bf16 *)x, (const bf16 *)gamma, stats, part.data(), rows, d, ns)
		   : ln_dx_apply_f32((float *)dx, (const float *)dy, (const float *)x, (const float *)gamma, stats, part.data(), rows, d, ns);
	});
}

void emu_layer_norm_dgb(int bf, void *dgamma, void *dbeta, const void *dy, const void *x, const float *stats,
		unsigned long long rows, unsigned long long d, int accumulate, unsigned long long chunk, unsigned threads) {
	unsigned long long nc = (rows + chunk - 1) / chunk;
	std::vector<double> part(2 * nc * d + 1);
	grid(threads, [&] {
		bf ? ln_dgb_part_bf16(part.data(), (const bf16 *)dy, (const bf16 *)x, stats, rows, d, chunk)
		   : ln_dgb_part_f32(part.data(), (const float *)dy, (const float *)x, stats, rows, d, chunk);
	});
	grid(threads, [&] {
		bf ? ln_dgb_sum_bf16((bf16 *)dgamma, (bf16 *)dbeta, part.data(), nc, d, accumulate)
		   : ln_dgb_sum_f32((float *)dgamma, (float *)dbeta, part.data(), nc, d, accumulate);
	});
}

void emu_embedding(int bf, void *y, const float *ids, const void *table, long long offset, unsigned long long rows,
		unsigned long long d, unsigned long long n, unsigned threads) {
	grid(threads, [&] {
		bf ? embedding_bf16((bf16 *)y, ids, (const bf16 *)table, offset, rows, d, n)
		   : embedding_f32((float *)y, ids, (const float *)table, offset, rows, d, n);
	});
}

void emu_embedding_grad(int bf, float *dtable, const void *dy, const float *ids, long long offset, unsigned long long rows,
		unsigned long long d, unsigned long long n, unsigned long long chunk, unsigned threads) {
	if (chunk) {
		unsigned long long nk = (n + chunk - 1) / chunk;
		std::vector<double> part(nk * rows * d + 1);
		grid(threads, [&] {
			bf ? emb_part_bf16(part.data(), (const bf16 *)dy, ids, offset, rows, d, n, chunk)
			   : emb_part_f32(part.data(), (const float *)dy, ids, offset, rows, d, n, chunk);
		});
		grid(threads, [&] { emb_sum(dtable, part.data(), rows, d, nk); });
		return;
	}
	grid(threads, [&] {
		bf ? embedding_grad_bf16(dtable, (const bf16 *)dy, ids, offset, rows, d, n)
		   : embedding_grad_f32(dtable, (const float *)dy, ids, offset, rows, d, n);
	});
}

void emu_cross_entropy(int bf, float *stats, const void *logits, const float *targets, long long offset,
		unsigned long long v, unsigned long long t, unsigned threads) {
	grid(threads, [&] {
		bf ? cross_entropy_bf16(stats, (const bf16 *)logits, targets, offset, v, t)
		   : cross_entropy_f32(stats, (const float *)logits, targets, offset, v, t);
	});
}

void emu_cross_entropy_grad(int bf, void *dl, const void *logits, const float *targets, const float *lse, long long offset,
		unsigned long long v, unsigned long long t, double scale, unsigned threads) {
	grid(threads, [&] {
		bf ? cross_entropy_grad_bf16((bf16 *)dl, (const bf16 *)logits, targets, lse, offset, v, t, scale)
		   : cross_entropy_grad_f32((float *)dl, (const float *)logits, targets, lse, offset, v, t, scale);
	});
}

double emu_cross_entropy_combine(float *lse, double *part, const float *stats, unsigned long long parts, unsigned long long rows, unsigned threads) {
	grid(threads, [&] { cross_entropy_combine(lse, part, stats, parts, rows); });
	double out = 0;
	grid(threads, [&] { sum_rows(&out, part, rows); });
	return out;
}

void emu_adamw(float *param, const float *grad, float *m, float *v, unsigned long long n,
		float decay, float step, float root, float eps, float w1, float b2, unsigned threads) {
	grid(threads, [&] { adamw_f32(param, grad, m, v, n, decay, step, root, eps, w1, b2); });
}

void emu_attn_fwd(int bf, void *o, float *lse, const void *q, const void *k, const void *v, const unsigned long long *a, int causal, unsigned threads) {
	grid(threads, [&] {
		bf ? attn_fwd_bf16((bf16 *)o, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], causal)
		   : attn_fwd_f32((float *)o, lse, (const float *)q, (const float *)k, (const float *)v, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], causal);
	});
}

void emu_attn_bwd(int bf, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k, const void *v, const void *o,
		const float *lse, double *delta, const unsigned long long *a, int causal, unsigned threads) {
	grid(threads, [&] {
		bf ? attn_delta_bf16(delta, (const bf16 *)dout, (const bf16 *)o, a[0], a[1], a[2], a[5])
		   : attn_delta_f32(delta, (const float *)dout, (const float *)o, a[0], a[1], a[2], a[5]);
	});
	grid(threads, [&] {
		bf ? attn_dq_bf16((bf16 *)dq, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, lse, delta, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], causal)
		   : attn_dq_f32((float *)dq, (const float *)dout, (const float *)q, (const float *)k, (const float *)v, lse, delta, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], causal);
	});
	grid(threads, [&] {
		bf ? attn_dkv_bf16((bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, lse, delta, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], causal)
		   : attn_dkv_f32((float *)dk, (float *)dv, (const float *)dout, (const float *)q, (const float *)k, (const float *)v, lse, delta, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], causal);
	});
}

void emu_attn_flash_fwd(int bf, void *o, float *lse, const void *q, const void *k, const void *v, const unsigned long long *a, int causal) {
	blocks(a[0] * a[1] * ((a[2] + MR_FQ - 1) / MR_FQ), MR_FQ, [&] {
		bf ? attn_flash_fwd_bf16((bf16 *)o, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], causal)
		   : attn_flash_fwd_f32((float *)o, lse, (const float *)q, (const float *)k, (const float *)v, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], causal);
	});
}

void emu_attn_flash_bwd(int bf, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k, const void *v, const void *o,
		const float *lse, double *delta, const unsigned long long *a, int causal, unsigned threads) {
	grid(threads, [&] {
		bf ? attn_delta_bf16(delta, (const bf16 *)dout, (const bf16 *)o, a[0], a[1], a[2], a[5])
		   : attn_delta_f32(delta, (const float *)dout, (const float *)o, a[0], a[1], a[2], a[5]);
	});
	blocks(a[0] * a[1] * ((a[2] + MR_FB - 1) / MR_FB), MR_FB, [&] {
		bf ? attn_flash_dq_bf16((bf16 *)dq, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, lse, delta, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], causal)
		   : attn_flash_dq_f32((float *)dq, (const float *)dout, (const float *)q, (const float *)k, (const float *)v, lse, delta, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], causal);
	});
	blocks(a[0] * a[1] * ((a[3] + MR_FB - 1) / MR_FB), MR_FB, [&] {
		bf ? attn_flash_dkv_bf16((bf16 *)dk, (bf16 *)dv, (const bf16 *)dout, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, lse, delta, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], causal)
		   : attn_flash_dkv_f32((float *)dk, (float *)dv, (const float *)dout, (const float *)q, (const float *)k, (const float *)v, lse, delta, a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], causal);
	});
}

void emu_attn_softmax(float *sc, void *p16, float *lse, unsigned long long rows, unsigned long long s, unsigned long long t, int causal,
		int given, unsigned long long seg, unsigned threads) {
	if (!given) {
		unsigned long long ns = (t + seg - 1) / seg;
		std::vector<double> part(2 * rows * ns + 1);
		grid(threads, [&] { attn_smax_part(part.data(), sc, rows, s, t, causal, seg); });
		grid(threads, [&] { attn_smax_lse(lse, part.data(), rows, ns); });
	}
	grid(threads, [&] { attn_smax_exp(sc, (bf16 *)p16, lse, rows, s, t, causal); });
}

void emu_attn_ds(float *ds, void *ds16, const float *p, const double *delta, unsigned long long rows, unsigned long long t, float scale,
		unsigned threads) {
	grid(threads, [&] { attn_ds_f32(ds, (bf16 *)ds16, p, delta, rows, t, scale); });
}

void emu_attn_delta(int bf, double *delta, const void *dout, const void *o, unsigned long long b, unsigned long long h, unsigned long long s,
		unsigned long long f, unsigned threads) {
	grid(threads, [&] {
		bf ? attn_delta_bf16(delta, (const bf16 *)dout, (const bf16 *)o, b, h, s, f) : attn_delta_f32(delta, (const float *)dout, (const float *)o, b, h, s, f);
	});
}
