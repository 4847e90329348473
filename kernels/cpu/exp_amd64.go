//go:build amd64 && !noasm

package cpu

import (
	"math"

	"golang.org/x/sys/cpu"
)

// expShiftF32 and expShiftF64 compute exp(float64(src[i]) − shift) for i <
// n, rounded to float32 or kept, as math.Exp does, and return how many they
// did: n, or where the first block of 8 they left begins (exp's special
// cases: the caller computes it with math.Exp).
//
//go:noescape
func expShiftF32(dst, src *float32, n int, shift float64) int

//go:noescape
func expShiftF64(dst *float64, src *float32, n int, shift float64) int

func init() {
	// math.Exp fuses its steps where the machine has FMA, which every
	// AVX-512 machine has: the kernels follow that path.
	if !cpu.X86.HasAVX512F || !cpu.X86.HasAVX512VL || !cpu.X86.HasAVX512DQ || !cpu.X86.HasFMA {
		return
	}
	expShift32 = func(dst, src []float32, shift float64) {
		n := len(src)
		dst = dst[:n]
		for i := 0; i < n; {
			i += expShiftF32(&dst[i], &src[i], n-i, shift)
			for end := min(i+8, n); i < end; i++ {
				dst[i] = float32(math.Exp(float64(src[i]) - shift))
			}
		}
	}
	expShift64 = func(dst []float64, src []float32, shift float64) {
		n := len(src)
		dst = dst[:n]
		for i := 0; i < n; {
			i += expShiftF64(&dst[i], &src[i], n-i, shift)
			for end := min(i+8, n); i < end; i++ {
				dst[i] = math.Exp(float64(src[i]) - shift)
			}
		}
	}
}
