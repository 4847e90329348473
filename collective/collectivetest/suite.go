// Package collectivetest is the conformance suite every collective transport
// passes: every op, every reduction, float32 and float64, sizes 0, 1, uneven
// and larger than a chunk, groups of 1 to 5 ranks, the groups of 2-D meshes, and
// placement plans executed against placement/sim.
package collectivetest

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/placement"
)

// Factory builds n connected Worlds (ranks 0..n-1) with opts; the suite closes
// them.
type Factory func(t testing.TB, n int, opts collective.Options) []*collective.World

// SuiteOptions are the options the suite runs with: small chunks and a small
// direct threshold so that rings, pipelining and chunk boundaries are exercised
// at test sizes.
func SuiteOptions() collective.Options {
	return collective.Options{Job: "conformance", ChunkBytes: 4 << 10, SmallBytes: 1 << 10, DataTimeout: 30 * time.Second}
}

// RunRanks runs fn on every rank concurrently and returns the errors by rank.
func RunRanks(ws []*collective.World, fn func(w *collective.World) error) []error {
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(w)
		}()
	}
	wg.Wait()
	return errs
}

func must(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// Run runs the whole suite against f.
func Run(t *testing.T, f Factory) {
	for n := 1; n <= 5; n++ {
		t.Run(fmt.Sprintf("ranks=%d", n), func(t *testing.T) {
			ws := f(t, n, SuiteOptions())
			defer closeAll(ws)
			sizes := []int{0, 1, 2, n - 1, n + 1, 7, 255, 1000, 3001}
			if !testing.Short() {
				sizes = append(sizes, 20011)
			}
			t.Run("all_reduce", func(t *testing.T) { testAllReduce[float32](t, ws, sizes); testAllReduce[float64](t, ws, sizes[:6]) })
			t.Run("all_gather", func(t *testing.T) { testAllGather[float32](t, ws, sizes); testAllGather[float64](t, ws, sizes[:6]) })
			t.Run("reduce_scatter", func(t *testing.T) {
				testReduceScatter[float32](t, ws, sizes)
				testReduceScatter[float64](t, ws, sizes[:6])
			})
			t.Run("all_to_all", func(t *testing.T) { testAllToAll[float32](t, ws); testAllToAll[float64](t, ws) })
			t.Run("broadcast", func(t *testing.T) { testBroadcast[float32](t, ws, sizes) })
			t.Run("send_recv", func(t *testing.T) { testSendRecv[float64](t, ws) })
			t.Run("barrier", func(t *testing.T) {
				must(t, RunRanks(ws, func(w *collective.World) error {
					c, err := w.WorldComm(context.Background())
					if err != nil {
						return err
					}
					for i := 0; i < 3; i++ {
						if err := c.Barrier(context.Background()); err != nil {
							return err
						}
					}
					return nil
				}))
			})
		})
	}
	for _, m := range []string{"dp=2,tp=2", "a=2,b=3"} {
		t.Run("mesh="+m, func(t *testing.T) {
			mesh, _ := placement.ParseMesh(m)
			ws := f(t, mesh.Size(), SuiteOptions())
			defer closeAll(ws)
			testMesh(t, ws, mesh)
			testPlans(t, ws, mesh)
		})
	}
}

func closeAll(ws []*collective.World) {
	for _, w := range ws {
		w.Close()
	}
}

// value is rank r's element i: small integers so sums are exact in float32.
func value(seed, r, i int) float64 { return float64((seed*31+r*7+i*13)%17 - 8) }

func fill[T collective.Float](x []T, seed, r, off int) {
	for i := range x {
		x[i] = T(value(seed, r, off+i))
	}
}

func reduceRef(op collective.ReduceOp, vals []float64) float64 {
	v := vals[0]
	for _, x := range vals[1:] {
		switch op {
		case collective.Max:
			v = max(v, x)
		case collective.Min:
			v = min(v, x)
		default:
			v += x
		}
	}
	if op == collective.Avg {
		v /= float64(len(vals))
	}
	return v
}

func close64(a, b float64) bool {
	d := a - b
	return d < 1e-5 && d > -1e-5
}

func worldRanks(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i
	}
	return r
}

var ops = []collective.ReduceOp{collective.Sum, collective.Avg, collective.Max, collective.Min}

func testAllReduce[T collective.Float](t *testing.T, ws []*collective.World, sizes []int) {
	n := len(ws)
	for _, size := range sizes {
		for _, op := range ops {
			out := make([][]T, n)
			must(t, RunRanks(ws, func(w *collective.World) error {
				c, err := w.WorldComm(context.Background())
				if err != nil {
					return err
				}
				buf := make([]T, size)
				fill(buf, size, w.Rank(), 0)
				if err := collective.AllReduce(context.Background(), c, buf, op); err != nil {
					return err
				}
				out[w.Rank()] = buf
				return nil
			}))
			vals := make([]float64, n)
			for i := 0; i < size; i++ {
				for r := range vals {
					vals[r] = value(size, r, i)
				}
				want := reduceRef(op, vals)
				for r := 0; r < n; r++ {
					if !close64(float64(out[r][i]), want) || out[r][i] != out[0][i] {
						t.Fatalf("all_reduce(%v) size %d rank %d [%d] = %v, want %v (rank 0 has %v)", op, size, r, i, out[r][i], want, out[0][i])
					}
				}
			}
		}
	}
}

func unevenCounts(n, size, seed int) []int {
	rng := rand.New(rand.NewSource(int64(seed*97 + n)))
	counts := make([]int, n)
	for i := range counts {
		counts[i] = rng.Intn(size + 1)
	}
	if n > 1 && seed%3 == 0 {
		counts[rng.Intn(n)] = 0
	}
	return counts
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

func testAllGather[T collective.Float](t *testing.T, ws []*collective.World, sizes []int) {
	n := len(ws)
	for _, size := range sizes {
		counts := unevenCounts(n, size, size)
		total := sum(counts)
		out := make([][]T, n)
		must(t, RunRanks(ws, func(w *collective.World) error {
			c, err := w.WorldComm(context.Background())
			if err != nil {
				return err
			}
			in := make([]T, counts[w.Rank()])
			fill(in, size, w.Rank(), 0)
			o := make([]T, total)
			if err := collective.AllGather(context.Background(), c, in, o, counts); err != nil {
				return err
			}
			out[w.Rank()] = o
			return nil
		}))
		for r := 0; r < n; r++ {
			k := 0
			for j := 0; j < n; j++ {
				for i := 0; i < counts[j]; i++ {
					if want := value(size, j, i); float64(out[r][k]) != want {
						t.Fatalf("all_gather counts %v rank %d: element %d of rank %d = %v, want %v", counts, r, i, j, out[r][k], want)
					}
					k++
				}
			}
		}
	}
}

func testReduceScatter[T collective.Float](t *testing.T, ws []*collective.World, sizes []int) {
	n := len(ws)
	for _, size := range sizes {
		for _, op := range ops {
			counts := unevenCounts(n, size, size+int(op))
			total := sum(counts)
			out := make([][]T, n)
			must(t, RunRanks(ws, func(w *collective.World) error {
				c, err := w.WorldComm(context.Background())
				if err != nil {
					return err
				}
				in := make([]T, total)
				fill(in, size, w.Rank(), 0)
				keep := append([]T(nil), in...)
				o := make([]T, counts[w.Rank()])
				if err := collective.ReduceScatter(context.Background(), c, in, o, counts, op); err != nil {
					return err
				}
				for i := range in {
					if in[i] != keep[i] {
						return fmt.Errorf("reduce_scatter modified its input at %d", i)
					}
				}
				out[w.Rank()] = o
				return nil
			}))
			off := 0
			vals := make([]float64, n)
			for r := 0; r < n; r++ {
				for i := 0; i < counts[r]; i++ {
					for j := range vals {
						vals[j] = value(size, j, off+i)
					}
					if want := reduceRef(op, vals); !close64(float64(out[r][i]), want) {
						t.Fatalf("reduce_scatter(%v) counts %v rank %d [%d] = %v, want %v", op, counts, r, i, out[r][i], want)
					}
				}
				off += counts[r]
			}
		}
	}
}

func testAllToAll[T collective.Float](t *testing.T, ws []*collective.World) {
	n := len(ws)
	for _, size := range []int{0, 1, 5, 3000} {
		// cnt[i][j]: elements i sends j.
		rng := rand.New(rand.NewSource(int64(size + n)))
		cnt := make([][]int, n)
		for i := range cnt {
			cnt[i] = make([]int, n)
			for j := range cnt[i] {
				cnt[i][j] = rng.Intn(size + 1)
			}
		}
		must(t, RunRanks(ws, func(w *collective.World) error {
			c, err := w.WorldComm(context.Background())
			if err != nil {
				return err
			}
			r := w.Rank()
			recvCounts := make([]int, n)
			for j := range recvCounts {
				recvCounts[j] = cnt[j][r]
			}
			send := make([]T, sum(cnt[r]))
			off := 0
			for j := 0; j < n; j++ {
				fill(send[off:off+cnt[r][j]], j, r, 0)
				off += cnt[r][j]
			}
			recv := make([]T, sum(recvCounts))
			if err := collective.AllToAll(context.Background(), c, send, cnt[r], recv, recvCounts); err != nil {
				return err
			}
			off = 0
			for j := 0; j < n; j++ {
				for i := 0; i < recvCounts[j]; i++ {
					if want := value(r, j, i); float64(recv[off+i]) != want {
						return fmt.Errorf("all_to_all size %d: rank %d got %v from %d at %d, want %v", size, r, recv[off+i], j, i, want)
					}
				}
				off += recvCounts[j]
			}
			return nil
		}))
	}
}

func testBroadcast[T collective.Float](t *testing.T, ws []*collective.World, sizes []int) {
	n := len(ws)
	for _, size := range sizes {
		root := size % n
		must(t, RunRanks(ws, func(w *collective.World) error {
			c, err := w.WorldComm(context.Background())
			if err != nil {
				return err
			}
			buf := make([]T, size)
			if w.Rank() == root {
				fill(buf, size, root, 0)
			}
			if err := collective.Broadcast(context.Background(), c, buf, root); err != nil {
				return err
			}
			for i := range buf {
				if want := value(size, root, i); float64(buf[i]) != want {
					return fmt.Errorf("broadcast size %d root %d: rank %d [%d] = %v, want %v", size, root, w.Rank(), i, buf[i], want)
				}
			}
			return nil
		}))
	}
}

func testSendRecv[T collective.Float](t *testing.T, ws []*collective.World) {
	n := len(ws)
	if n < 2 {
		return
	}
	// Ring shift, twice, with sizes 0 and 5000.
	must(t, RunRanks(ws, func(w *collective.World) error {
		c, err := w.WorldComm(context.Background())
		if err != nil {
			return err
		}
		r := w.Rank()
		for _, size := range []int{0, 5000} {
			out := make([]T, size)
			fill(out, size, r, 0)
			errc := make(chan error, 1)
			go func() { errc <- collective.Send(context.Background(), c, out, (r+1)%n) }()
			in := make([]T, size)
			if err := collective.Recv(context.Background(), c, in, (r-1+n)%n); err != nil {
				return err
			}
			if err := <-errc; err != nil {
				return err
			}
			for i := range in {
				if want := value(size, (r-1+n)%n, i); float64(in[i]) != want {
					return fmt.Errorf("recv size %d: rank %d [%d] = %v, want %v", size, r, i, in[i], want)
				}
			}
		}
		return nil
	}))
}

// testMesh runs all-reduce and all-gather on every group of every mesh dim and
// of the flattened dims.
func testMesh(t *testing.T, ws []*collective.World, mesh placement.Mesh) {
	dimsets := [][]int{}
	for d := 0; d < mesh.NDim(); d++ {
		dimsets = append(dimsets, []int{d})
	}
	dimsets = append(dimsets, []int{1, 0})
	for _, dims := range dimsets {
		size := 3001
		must(t, RunRanks(ws, func(w *collective.World) error {
			c, err := w.MeshComm(context.Background(), mesh, dims...)
			if err != nil {
				return err
			}
			group := mesh.Group(w.Rank(), dims...)
			buf := make([]float32, size)
			fill(buf, size, w.Rank(), 0)
			if err := collective.AllReduce(context.Background(), c, buf, collective.Sum); err != nil {
				return err
			}
			for i := range buf {
				want := 0.0
				for _, r := range group {
					want += value(size, r, i)
				}
				if float64(buf[i]) != want {
					return fmt.Errorf("mesh %s dims %v: rank %d [%d] = %v, want %v", mesh, dims, w.Rank(), i, buf[i], want)
				}
			}
			counts := make([]int, len(group))
			for i := range counts {
				counts[i] = 10 + 3*i
			}
			in := make([]float64, counts[c.Index()])
			fill(in, 1, w.Rank(), 0)
			out := make([]float64, sum(counts))
			if err := collective.AllGather(context.Background(), c, in, out, counts); err != nil {
				return err
			}
			k := 0
			for j, r := range group {
				for i := 0; i < counts[j]; i++ {
					if out[k] != value(1, r, i) {
						return fmt.Errorf("mesh %s dims %v all_gather: rank %d element %d", mesh, dims, w.Rank(), k)
					}
					k++
				}
			}
			return nil
		}))
	}
}
