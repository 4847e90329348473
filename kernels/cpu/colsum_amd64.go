//go:build amd64 && !noasm

package cpu

import "golang.org/x/sys/cpu"

// colSumF32 adds a's rows (rows×n, leading dim lda) to acc[:n], rows in
// order: AVX-512, the scalar loop's result bit for bit.
//
//go:noescape
func colSumF32(acc, a *float32, lda, rows, n int)

func init() {
	if cpu.X86.HasAVX512F {
		colSum32 = func(acc, a []float32, m, n, ld int) {
			if m == 0 || n == 0 {
				return
			}
			_ = acc[n-1]
			_ = a[(m-1)*ld+n-1]
			colSumF32(&acc[0], &a[0], ld, m, n)
		}
	}
}
