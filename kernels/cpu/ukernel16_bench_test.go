//go:build amd64 && !noasm

package cpu

import (
	"fmt"
	"testing"
	"unsafe"
)

// BenchmarkMicroKernelBF16 runs the bfloat16 packed micro-kernels on
// cache-resident panels (kc k values, kc/2 pairs), writing a bfloat16 tile: the
// ceiling of the bfloat16 loop nest. L2: B panels stream from L2 with a fixed
// A panel, as in the loop nest.
func BenchmarkMicroKernelBF16(b *testing.B) {
	for _, p := range bf16Paths {
		uk := p.uk
		if p.name == "go" {
			continue
		}
		for _, l2 := range []bool{false, true} {
			for _, kc := range []int{16, 256, 1024, 2048} {
				b.Run(fmt.Sprintf("%s_l2%v_kc%d", uk.name, l2, kc), func(b *testing.B) {
					d := uk.depth(kc)
					panels := 1
					if l2 {
						panels = max(1, (768<<10)/(d*uk.nr*4))
					}
					a := make([]float32, d*uk.mr)
					bp := make([]float32, panels*d*uk.nr)
					c := make([]bf16, uk.mr*uk.nr*panels)
					tile := make([]float32, uk.mr*uk.nr)
					var e epi16
					e.alpha, e.flags, e.ldOut, e.tile = 1, epiOutBF16, uk.nr*2, &tile[0]
					i := 0
					for b.Loop() {
						q := i % panels
						e.out = unsafePtr(&c[q*uk.mr*uk.nr])
						uk.fn(d, &a[0], &bp[q*d*uk.nr], uk.mr, 1<<uk.nr-1, &e)
						i++
					}
					b.ReportMetric(2*float64(kc*uk.mr*uk.nr)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}

func unsafePtr(p *bf16) unsafe.Pointer { return unsafe.Pointer(p) }
