package transport_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/tensor"
)

// TestArenaCollectives: all-reduce, all-gather and reduce-scatter over
// buffers from the shared-memory arena, on 2 and 3 ranks and with uneven
// counts, give the exact results and take the arena path; when one rank's
// buffer is not from its arena, every rank takes the ring and the results
// are the same.
func TestArenaCollectives(t *testing.T) {
	for _, n := range []int{2, 3} {
		for _, heapRank := range []int{-1, 1} {
			t.Run(fmt.Sprintf("ranks=%d/heap-rank=%d", n, heapRank), func(t *testing.T) {
				ws := shmWorlds(t, n, 0)
				want := "arena"
				if heapRank >= 0 {
					want = "ring"
				}
				errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
					return arenaOps(w, n, heapRank, want)
				})
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func arenaOps(w *collective.World, n, heapRank int, wantAlgo string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := w.WorldGroup(ctx)
	if err != nil {
		return err
	}
	k := w.Rank()
	alloc := func(m int) ([]float32, func(), error) {
		if k == heapRank {
			return make([]float32, m), func() {}, nil
		}
		b, err := collective.AllocShared[float32](w, m)
		if err != nil {
			return nil, nil, err
		}
		return b, func() { collective.FreeShared(w, b) }, nil
	}
	check := func(op string) error {
		if got := c.Algorithm(); got != wantAlgo {
			return fmt.Errorf("rank %d: %s took %q, want %q", k, op, got, wantAlgo)
		}
		return nil
	}
	const m = 100_003 // uneven over 2 and 3 ranks
	// All-reduce, sum and avg.
	for _, op := range []collective.ReduceOp{collective.Sum, collective.Avg, collective.Max} {
		buf, free, err := alloc(m)
		if err != nil {
			return err
		}
		for i := range buf {
			buf[i] = float32((k+1)*i%97 + k)
		}
		if err := collective.AllReduce(ctx, c, buf, op); err != nil {
			return err
		}
		for i, v := range buf {
			var sum, mx float32
			for r := 0; r < n; r++ {
				x := float32((r+1)*i%97 + r)
				sum += x
				mx = max(mx, x)
			}
			want := map[collective.ReduceOp]float32{collective.Sum: sum, collective.Avg: sum / float32(n), collective.Max: mx}[op]
			if v != want {
				return fmt.Errorf("rank %d: all_reduce %v element %d is %v, want %v", k, op, i, v, want)
			}
		}
		free()
		if err := check("all_reduce"); err != nil {
			return err
		}
	}
	// All-gather with uneven counts.
	counts := make([]int, n)
	total := 0
	for r := range counts {
		counts[r] = 70_000 + 7*r
		total += counts[r]
	}
	in, freeIn, err := alloc(counts[k])
	if err != nil {
		return err
	}
	for i := range in {
		in[i] = float32(1000*k + i%1000)
	}
	out := make([]float32, total)
	if err := collective.AllGather(ctx, c, in, out, counts); err != nil {
		return err
	}
	off := 0
	for r := 0; r < n; r++ {
		for i := 0; i < counts[r]; i++ {
			if want := float32(1000*r + i%1000); out[off+i] != want {
				return fmt.Errorf("rank %d: all_gather element %d of rank %d is %v, want %v", k, i, r, out[off+i], want)
			}
		}
		off += counts[r]
	}
	freeIn()
	if err := check("all_gather"); err != nil {
		return err
	}
	// Reduce-scatter.
	rin, freeR, err := alloc(total)
	if err != nil {
		return err
	}
	for i := range rin {
		rin[i] = float32(k + i%13)
	}
	rout := make([]float32, counts[k])
	if err := collective.ReduceScatter(ctx, c, rin, rout, counts, collective.Sum); err != nil {
		return err
	}
	base := 0
	for r := 0; r < k; r++ {
		base += counts[r]
	}
	for i, v := range rout {
		var want float32
		for r := 0; r < n; r++ {
			want += float32(r + (base+i)%13)
		}
		if v != want {
			return fmt.Errorf("rank %d: reduce_scatter element %d is %v, want %v", k, i, v, want)
		}
	}
	freeR()
	return check("reduce_scatter")
}

// TestArenaAlloc: the arena hands out page-aligned buffers, refuses what
// does not fit and what it did not hand out, and reuses what is given back.
func TestArenaAlloc(t *testing.T) {
	w := shmWorlds(t, 2, 1<<20)[0]
	a, err := collective.AllocShared[float32](w, 100_000) // 400,000 bytes: 98 pages
	if err != nil {
		t.Fatal(err)
	}
	b, err := collective.AllocShared[float64](w, 50_000) // 100 pages
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collective.AllocShared[float32](w, 100_000); !errors.Is(err, collective.ErrInvalid) {
		t.Fatalf("a third buffer past the 1 MiB arena: %v", err)
	}
	if err := collective.FreeShared(w, make([]float32, 10)); !errors.Is(err, collective.ErrInvalid) {
		t.Fatalf("freeing memory the arena did not hand out: %v", err)
	}
	if err := collective.FreeShared(w, a); err != nil {
		t.Fatal(err)
	}
	if err := collective.FreeShared(w, a); !errors.Is(err, collective.ErrInvalid) {
		t.Fatalf("freeing twice: %v", err)
	}
	if err := collective.FreeShared(w, b); err != nil {
		t.Fatal(err)
	}
	// Everything given back coalesces: one buffer of the whole arena fits.
	all, err := collective.AllocShared[tensor.BF16](w, 1<<19)
	if err != nil {
		t.Fatal(err)
	}
	all[len(all)-1] = 1
}

// TestSharedHost: tensors from SharedHost lie in the arena (an all-reduce
// over them takes the arena path), are zeroed, go back with Free, and come
// from the heap once the arena is full; without an arena it is host memory.
func TestSharedHost(t *testing.T) {
	ws := shmWorlds(t, 2, 4<<20)
	errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		m := collective.SharedHost(w)
		x, err := m.Alloc(tensor.Float32, 256, 1024) // 1 MiB
		if err != nil {
			return err
		}
		for i, v := range x.Float32() {
			if v != 0 {
				return fmt.Errorf("element %d of a new tensor is %v", i, v)
			}
			x.Float32()[i] = float32(w.Rank() + 1)
		}
		c, err := w.WorldGroup(ctx)
		if err != nil {
			return err
		}
		if err := collective.AllReduce(ctx, c, x.Float32(), collective.Sum); err != nil {
			return err
		}
		if x.Float32()[12345] != 3 || c.Algorithm() != "arena" {
			return fmt.Errorf("all-reduce over a SharedHost tensor: %v by %q", x.Float32()[12345], c.Algorithm())
		}
		// Past the 4 MiB arena: from the heap, still usable.
		big, err := m.Alloc(tensor.Float64, 1<<20)
		if err != nil || big.Len() != 1<<20 {
			return fmt.Errorf("a tensor past the arena: %v", err)
		}
		b16, err := m.Alloc(tensor.BFloat16, 1000)
		if err != nil {
			return err
		}
		for _, t := range []*tensor.Tensor{x, big, b16} {
			if err := m.Free(t); err != nil {
				return err
			}
		}
		if err := m.Free(x); err == nil {
			return errors.New("a tensor freed twice")
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	job2 := bootstraptest.NewJob()
	tcp := bootstraptest.JoinWorlds(t, bootstraptest.StartServer(t, job2), job2, 2, "tcp", collective.Options{})
	defer func() {
		for _, w := range tcp {
			w.Close()
		}
	}()
	if m := collective.SharedHost(tcp[0]); m != tensor.Host {
		t.Fatalf("SharedHost on tcp is %T, want tensor.Host", m)
	}
}

// shmWorlds joins n in-process ranks of a fresh job over the shm transport,
// with arenas of arena bytes (0: the default), closed when t ends (skipped
// without /dev/shm).
func shmWorlds(t *testing.T, n, arena int) []*collective.World {
	t.Helper()
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	job := bootstraptest.NewJob()
	ws := bootstraptest.JoinWorldsWith(t, bootstraptest.StartServer(t, job), job, n, "shm", collective.Options{}, func(c *bootstrap.Config) { c.Shm.ArenaBytes = arena })
	t.Cleanup(func() {
		for _, w := range ws {
			w.Close()
		}
	})
	return ws
}
