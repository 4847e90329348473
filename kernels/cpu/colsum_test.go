package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestColumnSumExact: columnSum's float32 sum (AVX-512 where the machine
// has it) is the scalar loop's bit for bit, adding to db or not, for row
// counts around its four-row groups, column counts around its 16-column
// chunks and rows wider than the sum (ld > n), on values of every
// magnitude and sign.
func TestColumnSumExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, m := range []int{0, 1, 3, 4, 5, 8, 13, 64} {
		for _, n := range []int{0, 1, 15, 16, 17, 31, 48, 100, 130} {
			for _, extra := range []int{0, 3} {
				for _, acc := range []bool{false, true} {
					t.Run(fmt.Sprintf("%dx%d/ld+%d/acc=%v", m, n, extra, acc), func(t *testing.T) {
						ld := n + extra
						a := make([]float32, m*ld+1)
						for i := range a {
							a[i] = float32(rng.NormFloat64() * math.Pow(10, float64(rng.IntN(9)-4)))
						}
						a[len(a)-1] = float32(math.NaN()) // past the last row: never read
						start := make([]float32, n+1)
						for j := range start {
							start[j] = float32(rng.NormFloat64())
						}
						want := append([]float32(nil), start...)
						if !acc {
							clear(want[:n])
						}
						for i := 0; i < m; i++ {
							for j := 0; j < n; j++ {
								want[j] += a[i*ld+j]
							}
						}
						got := append([]float32(nil), start...)
						columnSum(got, a[:len(a)-1], m, n, ld, acc)
						for j := range got {
							if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
								t.Fatalf("db[%d] = %v, want %v (the scalar loop's)", j, got[j], want[j])
							}
						}
					})
				}
			}
		}
	}
}
