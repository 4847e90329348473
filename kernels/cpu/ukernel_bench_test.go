//go:build amd64 && !noasm

package cpu

import (
	"fmt"
	"testing"
)

// BenchmarkMicroKernel runs the best float32 micro-kernel on cache-resident
// panels: the ceiling of the GEMM loop nest.
func BenchmarkMicroKernel(b *testing.B) {
	for _, uk := range kernels32[:3] {
		for _, kc := range []int{128, 256, 384, 512} {
			b.Run(fmt.Sprintf("%s_kc%d", uk.name, kc), func(b *testing.B) {
				a := make([]float32, kc*uk.mr)
				bp := make([]float32, kc*uk.nr)
				c := make([]float32, uk.mr*uk.nr)
				for b.Loop() {
					uk.fn(kc, &a[0], &bp[0], uk.nr, &c[0], uk.nr, uk.mr, 1<<uk.nr-1, 1, 1)
				}
				b.ReportMetric(2*float64(kc*uk.mr*uk.nr)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
