package collective

import (
	"math"
	"math/rand"
	"testing"
)

func refReduce[T Float](dst, src []T, op ReduceOp) {
	for i, v := range src {
		switch op {
		case Sum, Avg:
			dst[i] += v
		case Max:
			if v > dst[i] || v != v {
				dst[i] = v
			}
		case Min:
			if v < dst[i] || v != v {
				dst[i] = v
			}
		}
	}
}

func testReduce[T Float](t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, n := range []int{0, 1, 7, 8, 9, 31, 32, 33, 100, 1027} {
		for _, op := range []ReduceOp{Sum, Max, Min} {
			a, b := make([]T, n), make([]T, n)
			for i := range a {
				a[i], b[i] = T(rng.NormFloat64()), T(rng.NormFloat64())
				if rng.Intn(17) == 0 {
					a[i] = T(math.NaN())
				}
				if rng.Intn(17) == 0 {
					b[i] = T(math.NaN())
				}
			}
			want := append([]T(nil), a...)
			refReduce(want, b, op)
			got := append(append([]T(nil), a...), 12345) // guard element
			reduceInto(got[:n], b, op)
			for i := range want {
				w, g := float64(want[i]), float64(got[i])
				if !(w == g || math.IsNaN(w) && math.IsNaN(g)) {
					t.Fatalf("n=%d op=%v [%d]: %v op %v = %v, want %v", n, op, i, a[i], b[i], g, w)
				}
			}
			if got[n] != 12345 {
				t.Fatalf("n=%d op=%v wrote past the end", n, op)
			}
		}
	}
}

func TestReduceFloat32(t *testing.T) { testReduce[float32](t) }
func TestReduceFloat64(t *testing.T) { testReduce[float64](t) }

func BenchmarkReduceSum(b *testing.B) {
	dst, src := make([]float32, 1<<16), make([]float32, 1<<16)
	b.SetBytes(4 << 16)
	for i := 0; i < b.N; i++ {
		reduceInto(dst, src, Sum)
	}
}
