//go:build amd64 && !purego

package collective

import "golang.org/x/sys/cpu"

var haveAVX2 = cpu.X86.HasAVX2

// addF32 is, for i < n (a multiple of 8): dst[i] += src[i].
//
//go:noescape
func addF32(dst, src *float32, n int)

// addF64 is, for i < n (a multiple of 4): dst[i] += src[i].
//
//go:noescape
func addF64(dst, src *float64, n int)

// maxF32 is, for i < n (a multiple of 8):
// if src[i] > dst[i] || src[i] != src[i] { dst[i] = src[i] }.
//
//go:noescape
func maxF32(dst, src *float32, n int)

// minF32 is, for i < n (a multiple of 8):
// if src[i] < dst[i] || src[i] != src[i] { dst[i] = src[i] }.
//
//go:noescape
func minF32(dst, src *float32, n int)

// reduceVec reduces the vectorizable prefix of src into dst and returns its
// length; the caller finishes the tail.
func reduceVec[T Float](dst, src []T, op ReduceOp) int {
	if !haveAVX2 || len(src) < 8 {
		return 0
	}
	switch d := any(dst).(type) {
	case []float32:
		s := any(src).([]float32)
		n := len(s) &^ 7
		switch op {
		case Sum, Avg:
			addF32(&d[0], &s[0], n)
		case Max:
			maxF32(&d[0], &s[0], n)
		case Min:
			minF32(&d[0], &s[0], n)
		default:
			return 0
		}
		return n
	case []float64:
		if op != Sum && op != Avg {
			return 0
		}
		s := any(src).([]float64)
		n := len(s) &^ 3
		addF64(&d[0], &s[0], n)
		return n
	}
	return 0
}
