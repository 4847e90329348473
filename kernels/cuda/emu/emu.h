#ifdef __cplusplus
extern "C" {
#endif
void emu_gelu(int dt, void *y, const void *dy, const void *x, unsigned long long n, unsigned threads);
void emu_mse(int dt, void *dy, double *part, const void *y, const void *t, double scale, unsigned long long n, unsigned threads);
void emu_sum_stage(double *out, const double *in, unsigned long long n, unsigned threads);
void emu_axpy_bf16(void *y, const void *x, float alpha, unsigned long long n, unsigned threads);
void emu_bias_grad_bf16(void *db, int db32, const void *dy, unsigned long long m, unsigned long long n, int accumulate, unsigned threads);
void emu_cast(int to16, void *y, const void *x, unsigned long long n, unsigned threads);
#ifdef __cplusplus
}
#endif
