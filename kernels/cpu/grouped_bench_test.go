package cpu_test

import (
	"testing"
	"time"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// BenchmarkGroupedVsDense compares the grouped GEMM of a mixture-of-experts
// layer (T = 512 tokens routed to k = 2 of E = 8 experts, balanced: 128 rows
// each; H = 1024 inputs, 512 outputs per expert) with the dense GEMM of the
// same FLOPs ([T·k, H] by [H, 512]), calls alternating. It reports each one's
// GFLOP/s and grouped/dense, the grouped GEMM's speed relative to the dense.
func BenchmarkGroupedVsDense(b *testing.B) {
	const e, rows, h, f = 8, 1024, 1024, 512
	p := provider(b)
	counts := make([]int, e)
	for i := range counts {
		counts[i] = rows / e
	}
	x, dy := randTensor(tensor.Float32, rows, h), randTensor(tensor.Float32, rows, f)
	wg, w := randTensor(tensor.Float32, e, f, h), randTensor(tensor.Float32, f, h)
	y, dwg, dw := tensor.New(tensor.Float32, rows, f), tensor.New(tensor.Float32, e, f, h), tensor.New(tensor.Float32, f, h)
	for _, c := range []struct {
		name           string
		grouped, dense func() error
	}{
		{"forward", func() error { return kernels.GroupedLinearForward(p, counts, y, x, wg, nil) },
			func() error { return kernels.LinearForward(p, y, x, w, nil) }},
		{"backward_weight", func() error { return kernels.GroupedLinearBackwardWeight(p, counts, dwg, nil, dy, x, false) },
			func() error { return kernels.LinearBackwardWeight(p, dw, dy, x, false) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			var tg, td time.Duration
			for b.Loop() {
				t0 := time.Now()
				if err := c.grouped(); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := c.dense(); err != nil {
					b.Fatal(err)
				}
				tg, td = tg+t1.Sub(t0), td+time.Since(t1)
			}
			flops := 2.0 * rows * h * f * float64(b.N)
			b.ReportMetric(flops/tg.Seconds()/1e9, "grouped_GFLOP/s")
			b.ReportMetric(flops/td.Seconds()/1e9, "dense_GFLOP/s")
			b.ReportMetric(td.Seconds()/tg.Seconds(), "grouped/dense")
		})
	}
}
