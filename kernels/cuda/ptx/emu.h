#ifdef __cplusplus
extern "C" {
#endif
void emu_set_order(int order);
void emu_gelu(int dt, void *y, const void *dy, const void *x, unsigned long long n, unsigned threads);
void emu_mse(int dt, void *dy, double *part, const void *y, const void *t, double scale, unsigned long long n, unsigned threads);
void emu_sum_stage(double *out, const double *in, unsigned long long n, unsigned threads);
void emu_axpy_bf16(void *y, const void *x, float alpha, unsigned long long n, unsigned threads);
void emu_bias_grad_bf16(void *db, int db32, const void *dy, unsigned long long m, unsigned long long n, int accumulate,
	unsigned long long chunk, unsigned threads);
void emu_cast(int to16, void *y, const void *x, unsigned long long n, unsigned threads);
void emu_layer_norm(int bf, void *y, float *stats, const void *x, const void *gamma, const void *beta,
		unsigned long long rows, unsigned long long d, double eps, unsigned long long seg, unsigned threads);
void emu_layer_norm_block(int bf, void *y, float *stats, const void *x, const void *gamma, const void *beta,
		unsigned long long rows, unsigned long long d, double eps);
void emu_layer_norm_dx_block(int bf, void *dx, const void *dy, const void *x, const void *gamma, const float *stats,
		unsigned long long rows, unsigned long long d);
void emu_layer_norm_dx(int bf, void *dx, const void *dy, const void *x, const void *gamma, const float *stats,
		unsigned long long rows, unsigned long long d, unsigned long long seg, unsigned threads);
void emu_layer_norm_dgb(int bf, void *dgamma, void *dbeta, const void *dy, const void *x, const float *stats,
		unsigned long long rows, unsigned long long d, int accumulate, unsigned long long chunk, unsigned threads);
void emu_embedding(int bf, void *y, const float *ids, const void *table, long long offset, unsigned long long rows,
		unsigned long long d, unsigned long long n, unsigned threads);
void emu_embedding_grad(int bf, float *dtable, const void *dy, const float *ids, long long offset, unsigned long long rows,
		unsigned long long d, unsigned long long n, unsigned long long chunk, unsigned threads);
void emu_cross_entropy(int bf, float *stats, const void *logits, const float *targets, long long offset,
		unsigned long long v, unsigned long long t, unsigned threads);
void emu_cross_entropy_grad(int bf, void *dl, const void *logits, const float *targets, const float *lse, long long offset,
		unsigned long long v, unsigned long long t, double scale, unsigned threads);
double emu_cross_entropy_combine(float *lse, double *part, const float *stats, unsigned long long parts, unsigned long long rows, unsigned threads);
void emu_adamw(float *param, const float *grad, float *m, float *v, unsigned long long n,
		float decay, float step, float root, float eps, float w1, float b2, unsigned threads);
void emu_attn_fwd(int bf, void *o, float *lse, const void *q, const void *k, const void *v, const unsigned long long *a, int causal, unsigned threads);
void emu_attn_bwd(int bf, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k, const void *v, const void *o,
		const float *lse, double *delta, const unsigned long long *a, int causal, unsigned threads);
void emu_attn_flash_fwd(int bf, void *o, float *lse, const void *q, const void *k, const void *v, const unsigned long long *a, int causal);
void emu_attn_flash_bwd(int bf, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k, const void *v, const void *o,
		const float *lse, double *delta, const unsigned long long *a, int causal, unsigned threads);
void emu_attn_softmax(float *sc, void *p16, float *lse, unsigned long long rows, unsigned long long s, unsigned long long t, int causal,
		int given, unsigned long long seg, unsigned threads);
void emu_attn_ds(float *ds, void *ds16, const float *p, const double *delta, unsigned long long rows, unsigned long long t, float scale,
		unsigned threads);
void emu_attn_delta(int bf, double *delta, const void *dout, const void *o, unsigned long long b, unsigned long long h, unsigned long long s,
		unsigned long long f, unsigned threads);
#ifdef __cplusplus
}
#endif
