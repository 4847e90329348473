//go:build amd64 && !noasm

package cpu

import "golang.org/x/sys/cpu"

// adamwF32 is AdamW's float32 loop over n elements (adamw32).
//
//go:noescape
func adamwF32(param, grad, mom, vel *float32, n int, k *adamwK)

// axpyF32 sets y[i] += alpha·x[i] for i < n (addScaled32): the product
// rounded, then the sum, as axpy's Go loop (saxpy1AVX512, the GEMV's, fuses
// them).
//
//go:noescape
func axpyF32(alpha float32, x, y *float32, n int)

func init() {
	if !cpu.X86.HasAVX512F {
		return
	}
	adamw32 = func(p, g, m, v []float32, k *adamwK) {
		if n := len(p); n > 0 {
			_, _, _ = g[n-1], m[n-1], v[n-1]
			adamwF32(&p[0], &g[0], &m[0], &v[0], n, k)
		}
	}
	addScaled32 = func(alpha float32, x, y []float32) {
		if n := len(y); n > 0 {
			_ = x[n-1]
			axpyF32(alpha, &x[0], &y[0], n)
		}
	}
}
