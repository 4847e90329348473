package collectivetest

// The suite's tests of each collective, against the reference of its
// definition on every rank's inputs.

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

var ops = []collective.ReduceOp{collective.Sum, collective.Avg, collective.Max, collective.Min}

func testAllReduce[T collective.Float](t *testing.T, e *env, sizes []int) {
	n := len(e.ws)
	for _, size := range sizes {
		for _, op := range ops {
			out := make([][]T, n)
			e.onWorld(t, func(w *collective.World, c collective.Communicator) error {
				buf := make([]T, size)
				fill(buf, size, w.Rank(), 0)
				d := put(e, w.Rank(), buf)
				if err := c.AllReduce(context.Background(), d, op); err != nil {
					return err
				}
				out[w.Rank()] = get[T](d)
				return nil
			})
			vals := make([]float64, n)
			for i := 0; i < size; i++ {
				for r := range vals {
					vals[r] = value(size, r, i)
				}
				want := reduceRef(op, vals)
				for r := 0; r < n; r++ {
					if !closeT(out[r][i], want) || out[r][i] != out[0][i] {
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

func testAllGather[T collective.Float](t *testing.T, e *env, sizes []int) {
	n := len(e.ws)
	for _, size := range sizes {
		for _, even := range []bool{true, false} {
			counts := unevenCounts(n, size, size)
			if even {
				for i := range counts {
					counts[i] = size
				}
			}
			testAllGatherCounts[T](t, e, size, counts)
		}
	}
}

func testAllGatherCounts[T collective.Float](t *testing.T, e *env, size int, counts []int) {
	n := len(e.ws)
	{
		total := sum(counts)
		out := make([][]T, n)
		e.onWorld(t, func(w *collective.World, c collective.Communicator) error {
			in := make([]T, counts[w.Rank()])
			fill(in, size, w.Rank(), 0)
			o := alloc[T](e, w.Rank(), total)
			if err := c.AllGather(context.Background(), put(e, w.Rank(), in), o, counts); err != nil {
				return err
			}
			out[w.Rank()] = get[T](o)
			return nil
		})
		for r := 0; r < n; r++ {
			k := 0
			for j := 0; j < n; j++ {
				for i := 0; i < counts[j]; i++ {
					if want := value(size, j, i); f64(out[r][k]) != want {
						t.Fatalf("all_gather counts %v rank %d: element %d of rank %d = %v, want %v", counts, r, i, j, out[r][k], want)
					}
					k++
				}
			}
		}
	}
}

func testReduceScatter[T collective.Float](t *testing.T, e *env, sizes []int) {
	n := len(e.ws)
	for _, size := range sizes {
		for _, op := range ops {
			counts := unevenCounts(n, size, size+int(op))
			if op == collective.Sum { // and even counts once per size
				for i := range counts {
					counts[i] = size
				}
			}
			total := sum(counts)
			out := make([][]T, n)
			e.onWorld(t, func(w *collective.World, c collective.Communicator) error {
				in := make([]T, total)
				fill(in, size, w.Rank(), 0)
				din := put(e, w.Rank(), in)
				o := alloc[T](e, w.Rank(), counts[w.Rank()])
				if err := c.ReduceScatter(context.Background(), din, o, counts, op); err != nil {
					return err
				}
				after := get[T](din)
				for i := range in {
					if after[i] != in[i] {
						return fmt.Errorf("reduce_scatter modified its input at %d", i)
					}
				}
				out[w.Rank()] = get[T](o)
				return nil
			})
			off := 0
			vals := make([]float64, n)
			for r := 0; r < n; r++ {
				for i := 0; i < counts[r]; i++ {
					for j := range vals {
						vals[j] = value(size, j, off+i)
					}
					if want := reduceRef(op, vals); !closeT(out[r][i], want) {
						t.Fatalf("reduce_scatter(%v) counts %v rank %d [%d] = %v, want %v", op, counts, r, i, out[r][i], want)
					}
				}
				off += counts[r]
			}
		}
	}
}

func testAllToAll[T collective.Float](t *testing.T, e *env) {
	n := len(e.ws)
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
		e.onWorld(t, func(w *collective.World, c collective.Communicator) error {
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
			drecv := alloc[T](e, r, sum(recvCounts))
			if err := c.AllToAll(context.Background(), put(e, r, send), cnt[r], drecv, recvCounts); err != nil {
				return err
			}
			recv := get[T](drecv)
			off = 0
			for j := 0; j < n; j++ {
				for i := 0; i < recvCounts[j]; i++ {
					if want := value(r, j, i); f64(recv[off+i]) != want {
						return fmt.Errorf("all_to_all size %d: rank %d got %v from %d at %d, want %v", size, r, recv[off+i], j, i, want)
					}
				}
				off += recvCounts[j]
			}
			return nil
		})
	}
}

func testBroadcast[T collective.Float](t *testing.T, e *env, sizes []int) {
	n := len(e.ws)
	for _, size := range sizes {
		root := size % n
		e.onWorld(t, func(w *collective.World, c collective.Communicator) error {
			buf := make([]T, size)
			if w.Rank() == root {
				fill(buf, size, root, 0)
			}
			d := put(e, w.Rank(), buf)
			if err := c.Broadcast(context.Background(), d, root); err != nil {
				return err
			}
			buf = get[T](d)
			for i := range buf {
				if want := value(size, root, i); f64(buf[i]) != want {
					return fmt.Errorf("broadcast size %d root %d: rank %d [%d] = %v, want %v", size, root, w.Rank(), i, buf[i], want)
				}
			}
			return nil
		})
	}
}

func testSendRecv[T collective.Float](t *testing.T, ws []*collective.World) {
	n := len(ws)
	if n < 2 {
		return
	}
	// Ring shift, twice, with sizes 0 and 5000.
	must(t, RunRanks(ws, func(w *collective.World) error {
		c, err := w.WorldGroup(context.Background())
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
				if want := value(size, (r-1+n)%n, i); f64(in[i]) != want {
					return fmt.Errorf("recv size %d: rank %d [%d] = %v, want %v", size, r, i, in[i], want)
				}
			}
		}
		return nil
	}))
}

// testMesh runs all-reduce and all-gather on every group of every mesh dim and
// of the flattened dims.
func testMesh(t *testing.T, e *env, mesh placement.Mesh) {
	dimsets := [][]int{}
	for d := 0; d < mesh.NDim(); d++ {
		dimsets = append(dimsets, []int{d})
	}
	dimsets = append(dimsets, []int{1, 0})
	for _, dims := range dimsets {
		size := 3001
		must(t, RunRanks(e.ws, func(w *collective.World) error {
			group := mesh.Group(w.Rank(), dims...)
			c, err := e.comm(w, group)
			if err != nil {
				return err
			}
			buf := make([]float32, size)
			fill(buf, size, w.Rank(), 0)
			d := put(e, w.Rank(), buf)
			if err := c.AllReduce(context.Background(), d, collective.Sum); err != nil {
				return err
			}
			buf = get[float32](d)
			for i := range buf {
				want := 0.0
				for _, r := range group {
					want += value(size, r, i)
				}
				if f64(buf[i]) != want {
					return fmt.Errorf("mesh %s dims %v: rank %d [%d] = %v, want %v", mesh, dims, w.Rank(), i, buf[i], want)
				}
			}
			counts := make([]int, len(group))
			for i := range counts {
				counts[i] = 10 + 3*i
			}
			in := make([]float64, counts[c.Index()])
			fill(in, 1, w.Rank(), 0)
			dout := alloc[float64](e, w.Rank(), sum(counts))
			if err := c.AllGather(context.Background(), put(e, w.Rank(), in), dout, counts); err != nil {
				return err
			}
			out := get[float64](dout)
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

// BF16SumBound is the documented bound of a bfloat16 sum over n ranks: every
// hop adds in float32 and rounds once, so the result is within
// (n−1)·2^−8·Σ|x_r| of the exact sum of the (bfloat16) inputs.
func BF16SumBound(n int, absSum float64) float64 {
	return float64(max(n-1, 0)) * tensor.BF16Epsilon / 2 * absSum
}

// testBF16Bound all-reduces random bfloat16 values (not exact in sums) and
// checks every element against the float64 sum of the same inputs, within
// BF16SumBound, on every rank alike.
func testBF16Bound(t *testing.T, e *env) {
	n := len(e.ws)
	const size = 5000
	in := make([][]tensor.BF16, n)
	rng := rand.New(rand.NewSource(int64(n)))
	for r := range in {
		in[r] = make([]tensor.BF16, size)
		for i := range in[r] {
			in[r][i] = tensor.ToBF16(float32(rng.NormFloat64() * math.Pow(2, float64(rng.Intn(8)-4))))
		}
	}
	out := make([][]tensor.BF16, n)
	e.onWorld(t, func(w *collective.World, c collective.Communicator) error {
		d := put(e, w.Rank(), append([]tensor.BF16(nil), in[w.Rank()]...))
		if err := c.AllReduce(context.Background(), d, collective.Sum); err != nil {
			return err
		}
		out[w.Rank()] = get[tensor.BF16](d)
		return nil
	})
	worst := 0.0
	for i := 0; i < size; i++ {
		var exact, abs float64
		for r := range in {
			v := float64(in[r][i].Float32())
			exact += v
			abs += math.Abs(v)
		}
		for r := range out {
			if out[r][i] != out[0][i] {
				t.Fatalf("element %d: rank %d has %v, rank 0 %v", i, r, out[r][i], out[0][i])
			}
		}
		err := math.Abs(float64(out[0][i].Float32()) - exact)
		if bound := BF16SumBound(n, abs); err > bound {
			t.Fatalf("element %d: bf16 sum %v, exact %v: error %.3g over the bound %.3g", i, out[0][i], exact, err, bound)
		}
		if abs > 0 {
			worst = max(worst, err/abs)
		}
	}
	t.Logf("%d ranks: worst error %.3g of Σ|x| (bound %.3g)", n, worst, BF16SumBound(n, 1))
}
