//go:build amd64 && !noasm

package cpu

import (
	"math"
	"unsafe"

	"golang.org/x/sys/cpu"
)

// expShift computes exp(float64(src[i]) − shift) for i < n as math.Exp
// does, into dst: float64 where wide, else rounded to float32 (dst may then
// be src). It returns how many it did: n, or where the first block of 8 it
// left begins (exp's special cases: the caller computes it with math.Exp).
//
//go:noescape
func expShift(dst unsafe.Pointer, src *float32, n int, shift float64, wide bool) int

func init() {
	// math.Exp fuses its steps where the machine has FMA, which every
	// AVX-512 machine has: the kernels follow that path.
	if !cpu.X86.HasAVX512F || !cpu.X86.HasAVX512VL || !cpu.X86.HasAVX512DQ || !cpu.X86.HasFMA {
		return
	}
	expShift32 = func(dst, src []float32, shift float64) { expLoop(dst, src, shift, false) }
	expShift64 = func(dst []float64, src []float32, shift float64) { expLoop(dst, src, shift, true) }
}

// expLoop runs expShift over src into dst (float64 where wide), and the
// blocks it leaves through math.Exp.
func expLoop[D float32 | float64](dst []D, src []float32, shift float64, wide bool) {
	n := len(src)
	dst = dst[:n]
	for i := 0; i < n; {
		i += expShift(unsafe.Pointer(&dst[i]), &src[i], n-i, shift, wide)
		for end := min(i+8, n); i < end; i++ {
			dst[i] = D(math.Exp(float64(src[i]) - shift))
		}
	}
}
