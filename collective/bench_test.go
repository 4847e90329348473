package collective_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
)

// BenchmarkAllReduce runs ranks as goroutines of one process (the cross-process
// numbers come from bench/collective).
func BenchmarkAllReduce(b *testing.B) {
	for _, tr := range []string{"local", "shm", "tcp"} {
		for _, n := range []int{2, 4} {
			for _, size := range []int{4 << 10, 1 << 20, 16 << 20} {
				b.Run(fmt.Sprintf("%s/ranks=%d/bytes=%d", tr, n, size), func(b *testing.B) {
					var ws []*collective.World
					if tr == "local" {
						ws = localWorlds(b, n, collective.Options{})
					} else {
						ws = bootstraptest.JoinedWorlds(tr)(b, n, collective.Options{})
					}
					defer func() {
						for _, w := range ws {
							w.Close()
						}
					}()
					b.SetBytes(int64(size))
					b.ReportAllocs()
					errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
						c, err := w.WorldGroup(context.Background())
						if err != nil {
							return err
						}
						buf := make([]float32, size/4)
						if w.Rank() == 0 {
							b.ResetTimer()
						}
						for i := 0; i < b.N; i++ {
							if err := collective.AllReduce(context.Background(), c, buf, collective.Sum); err != nil {
								return err
							}
						}
						return nil
					})
					for _, err := range errs {
						if err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
