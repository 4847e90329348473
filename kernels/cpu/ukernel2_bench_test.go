//go:build amd64 && !noasm

package cpu

import (
	"fmt"
	"testing"
)

// BenchmarkMicroKernelL2 streams B micro-panels from L2 with a fixed A panel,
// as the loop nest does with a large KC.
func BenchmarkMicroKernelL2(b *testing.B) {
	for _, uk := range kernels32[:2] {
		for _, kc := range []int{256, 512, 1024} {
			b.Run(fmt.Sprintf("%s_kc%d", uk.name, kc), func(b *testing.B) {
				panels := (768 << 10) / (kc * uk.nr * 4)
				a := make([]float32, kc*uk.mr*2)
				bp := make([]float32, panels*kc*uk.nr)
				c := make([]float32, uk.mr*uk.nr*panels)
				i := 0
				for b.Loop() {
					p := i % panels
					uk.fn(kc, &a[(i/panels)%2*kc*uk.mr], &bp[p*kc*uk.nr], uk.nr, &c[p*uk.mr*uk.nr], uk.nr, uk.mr, 1<<uk.nr-1, 1, 1)
					i++
				}
				b.ReportMetric(2*float64(kc*uk.mr*uk.nr)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
