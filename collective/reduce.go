package collective

import "github.com/meshrun/meshrun/tensor"

// reduceInto sets dst[i] = dst[i] op src[i]: AVX2 where the CPU has it
// (reduce_amd64.s), then loops unrolled by 8 with the bounds checks hoisted.
// bfloat16 is widened to float32, reduced, and rounded once (to nearest even).
func reduceInto[T Float](dst, src []T, op ReduceOp) {
	if d, ok := any(dst).([]tensor.BF16); ok {
		reduceBF16(d, any(src).([]tensor.BF16), op)
		return
	}
	dst = dst[:len(src)]
	if v := reduceVec(dst, src, op); v > 0 {
		dst, src = dst[v:], src[v:]
	}
	n := len(src)
	switch op {
	case Sum, Avg:
		i := 0
		for ; i+8 <= n; i += 8 {
			d := dst[i : i+8 : i+8]
			s := src[i : i+8 : i+8]
			d[0] += s[0]
			d[1] += s[1]
			d[2] += s[2]
			d[3] += s[3]
			d[4] += s[4]
			d[5] += s[5]
			d[6] += s[6]
			d[7] += s[7]
		}
		for ; i < n; i++ {
			dst[i] += src[i]
		}
	case Max:
		for i, v := range src {
			if v > dst[i] || v != v {
				dst[i] = v
			}
		}
	case Min:
		for i, v := range src {
			if v < dst[i] || v != v {
				dst[i] = v
			}
		}
	}
}

// reduceBF16 is reduceInto on bfloat16: each element widened to float32,
// reduced there, rounded once.
func reduceBF16(dst, src []tensor.BF16, op ReduceOp) {
	dst = dst[:len(src)]
	for i, s := range src {
		a, b := dst[i].Float32(), s.Float32()
		switch op {
		case Sum, Avg:
			a += b
		case Max:
			if b > a || b != b {
				a = b
			}
		case Min:
			if b < a || b != b {
				a = b
			}
		}
		dst[i] = tensor.ToBF16(a)
	}
}

// scale divides by n (Avg): every rank that holds a copy computes the same bits.
func scale[T Float](x []T, n int) {
	if b, ok := any(x).([]tensor.BF16); ok {
		for i, v := range b {
			b[i] = tensor.ToBF16(v.Float32() / float32(n))
		}
		return
	}
	d := T(n)
	for i := range x {
		x[i] /= d
	}
}
