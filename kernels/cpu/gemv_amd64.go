//go:build amd64 && !noasm

package cpu

import "golang.org/x/sys/cpu"

// sdot4AVX512 sets out[i] = Σ_k x[k]·a[i*lda+k] for i < 4 and k < n.
//
//go:noescape
func sdot4AVX512(n int, x, a *float32, lda int, out *[gemvRows]float32)

// saxpy4AVX512 adds x[i]·a[i*lda+j] to acc[j] for rows i = 0..3 in order, j < n.
//
//go:noescape
func saxpy4AVX512(n int, x, a *float32, lda int, acc *float32)

// saxpy1AVX512 adds x[0]·a[j] to acc[j] for j < n.
//
//go:noescape
func saxpy1AVX512(n int, x, a *float32, acc *float32)

var (
	dot32  dotFunc[float32]  = dotGo[float32]
	axpy32 axpyFunc[float32] = axpyGo[float32]
)

func init() {
	if cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512DQ && cpu.X86.HasAVX512VL {
		dot32, axpy32 = dotAVX512, axpyAVX512
	}
}

func dotAVX512(n int, x, a []float32, lda int, out *[gemvRows]float32) {
	if n == 0 {
		*out = [gemvRows]float32{}
		return
	}
	_ = x[n-1]
	_ = a[3*lda+n-1]
	sdot4AVX512(n, &x[0], &a[0], lda, out)
}

func axpyAVX512(acc, x, a []float32, lda int) {
	n, rows := len(acc), len(x)
	if n == 0 || rows == 0 {
		return
	}
	_ = a[(rows-1)*lda+n-1]
	r := 0
	for ; r+4 <= rows; r += 4 {
		saxpy4AVX512(n, &x[r], &a[r*lda], lda, &acc[0])
	}
	for ; r < rows; r++ {
		saxpy1AVX512(n, &x[r], &a[r*lda], &acc[0])
	}
}
