package collective

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/meshrun/meshrun/tensor"
)

// staged is the backend for device buffers without a device collective
// library: each collective is cut into rounds of at most StageBytes per rank,
// and round i's copy to host memory, its host collective (a Group's, with all
// its coordination) and its copy back overlap: while round i's collective runs,
// round i+1 is being copied out of the device and round i-1 back into it. The
// copies go through the tensors' Memory, counted as Staging.
//
// Every member cuts a call into the same rounds (the count comes from what all
// members know: the buffer length, or the counts), so the rounds pair up.
type staged struct {
	g     *Group
	dev   tensor.Device
	chunk int

	mu   sync.Mutex // the staging buffer is one call's at a time
	host []byte
	hmem tensor.Memory
}

func newStaged(g *Group, dev tensor.Device, chunk int) *staged {
	return &staged{g: g, dev: dev, chunk: max(chunk, 8)}
}

func (s *staged) Backend() string       { return BackendStaged }
func (s *staged) Device() tensor.Device { return s.dev }
func (s *staged) Ranks() []int          { return s.g.Ranks() }
func (s *staged) Index() int            { return s.g.Index() }
func (s *staged) Algorithm() string     { return "staged/" + s.g.Algorithm() }

func (s *staged) Barrier(ctx context.Context) error { return s.g.Barrier(ctx) }

// stage returns n bytes of host staging memory from m (kept between calls).
func (s *staged) stage(m tensor.Memory, n int) ([]byte, error) {
	if len(s.host) >= n && s.hmem == m {
		return s.host[:n], nil
	}
	if s.host != nil {
		if err := s.hmem.HostFree(s.host); err != nil {
			return nil, err
		}
		s.host, s.hmem = nil, nil
	}
	h, err := m.HostAlloc(max(n, 64))
	if err != nil {
		return nil, fmt.Errorf("collective: staging %d bytes: %w", n, err)
	}
	s.host, s.hmem = h, m
	return h[:n], nil
}

// rounds is how many rounds move up to most elements per rank.
func (s *staged) rounds(most, esize int) int {
	per := max(1, s.chunk/esize)
	return max(1, (most+per-1)/per)
}

var errStopped = errors.New("collective: pipeline stopped")

// pipeline runs in(i), run(i), out(i) for rounds i = 0..n-1, in order within
// each stage: a goroutine runs in ahead of run, another out behind it. It
// returns the first error; after one, no new in or run starts.
func pipeline(n int, in, run, out func(i int) error) error {
	if n == 1 {
		if err := in(0); err != nil {
			return err
		}
		if err := run(0); err != nil {
			return err
		}
		return out(0)
	}
	ready := make(chan error, n)
	done := make(chan int, n)
	var stop atomic.Bool
	var wg sync.WaitGroup
	var outErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i++ {
			if stop.Load() {
				ready <- errStopped
				return
			}
			ready <- in(i)
		}
	}()
	go func() {
		defer wg.Done()
		for i := range done {
			if outErr == nil {
				outErr = out(i)
			}
		}
	}()
	var err error
	for i := 0; i < n; i++ {
		if err = <-ready; err != nil {
			break
		}
		if err = run(i); err != nil {
			break
		}
		done <- i
	}
	stop.Store(true)
	close(done)
	wg.Wait()
	if err == nil {
		err = outErr
	}
	return err
}

// read and write copy elements [lo, hi) of a device tensor to and from host
// bytes h (element offsets; nothing for an empty range).
func read(m tensor.Memory, h []byte, t *tensor.Tensor, lo, hi, es int) error {
	if hi <= lo {
		return nil
	}
	return m.Read(h[:(hi-lo)*es], t, lo*es, tensor.Staging)
}

func write(m tensor.Memory, t *tensor.Tensor, lo, hi, es int, h []byte) error {
	if hi <= lo {
		return nil
	}
	return m.Write(t, lo*es, h[:(hi-lo)*es], tensor.Staging)
}

// flat is one call on a whole buffer cut into rounds of s.chunk bytes. The
// caller holds s.mu.
type flat struct {
	m      tensor.Memory
	dt     tensor.DType
	es, n  int
	rounds int
	h      []byte // staging for the whole buffer
}

func (s *staged) flat(buf *tensor.Tensor) (flat, error) {
	dt, err := sameDevice(s.dev, buf)
	if err != nil {
		return flat{}, err
	}
	f := flat{m: tensor.MemoryOf(buf), dt: dt, es: dt.Size(), n: buf.Len()}
	f.rounds = s.rounds(f.n, f.es)
	f.h, err = s.stage(f.m, f.n*f.es)
	return f, err
}

// span is round i's elements; in and out copy them between buf and staging.
func (f flat) span(i int) (int, int) { return balanced(f.n, f.rounds, i) }
func (f flat) bytes(i int) []byte    { lo, hi := f.span(i); return f.h[lo*f.es : hi*f.es] }
func (f flat) in(buf *tensor.Tensor, i int) error {
	lo, hi := f.span(i)
	return read(f.m, f.h[lo*f.es:], buf, lo, hi, f.es)
}
func (f flat) out(buf *tensor.Tensor, i int) error {
	lo, hi := f.span(i)
	return write(f.m, buf, lo, hi, f.es, f.h[lo*f.es:])
}

func (s *staged) AllReduce(ctx context.Context, buf *tensor.Tensor, op ReduceOp) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := s.flat(buf)
	if err != nil {
		return err
	}
	return pipeline(f.rounds,
		func(i int) error { return f.in(buf, i) },
		func(i int) error { return hostAllReduce(ctx, s.g, f.dt, f.bytes(i), op) },
		func(i int) error { return f.out(buf, i) })
}

// Broadcast: only the root copies out of its device, only the others back in.
func (s *staged) Broadcast(ctx context.Context, buf *tensor.Tensor, root int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := s.flat(buf)
	if err != nil {
		return err
	}
	isRoot := s.g.Index() == root
	none := func(int) error { return nil }
	in, out := none, none
	if isRoot {
		in = func(i int) error { return f.in(buf, i) }
	} else {
		out = func(i int) error { return f.out(buf, i) }
	}
	return pipeline(f.rounds, in, func(i int) error { return hostBroadcast(ctx, s.g, f.dt, f.bytes(i), root) }, out)
}

// pieces cuts each member's count into k rounds: piece (r, j) is elements
// [lo, hi) of member r's segment.
func pieces(counts []int, k int) [][][2]int {
	p := make([][][2]int, len(counts))
	for r, c := range counts {
		p[r] = make([][2]int, k)
		for j := range k {
			lo, hi := balanced(c, k, j)
			p[r][j] = [2]int{lo, hi}
		}
	}
	return p
}

func (s *staged) AllGather(ctx context.Context, in, out *tensor.Tensor, counts []int) error {
	dt, err := sameDevice(s.dev, in, out)
	if err != nil {
		return err
	}
	me, n := s.g.Index(), s.g.Size()
	offs, total, err := offsets(counts)
	if err != nil {
		return err
	}
	if len(counts) != n || in.Len() != counts[me] || out.Len() != total {
		return invalid("all_gather: %d counts for a group of %d, in %d elements (count %d), out %d (total %d)",
			len(counts), n, in.Len(), counts[min(me, len(counts)-1)], out.Len(), total)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, es := tensor.MemoryOf(in), dt.Size()
	// Staging: this member's input, then each round's gathered pieces.
	h, err := s.stage(m, (counts[me]+total)*es)
	if err != nil {
		return err
	}
	hin, hout := h[:counts[me]*es], h[counts[me]*es:]
	k := s.rounds(slicesMax(counts), es)
	pc := pieces(counts, k)
	base := roundBases(pc, k)
	roundCounts := func(j int) []int {
		c := make([]int, n)
		for r := range c {
			c[r] = pc[r][j][1] - pc[r][j][0]
		}
		return c
	}
	return pipeline(k,
		func(j int) error {
			lo, hi := pc[me][j][0], pc[me][j][1]
			return read(m, hin[lo*es:], in, lo, hi, es)
		},
		func(j int) error {
			lo, hi := pc[me][j][0], pc[me][j][1]
			return hostAllGather(ctx, s.g, dt, hin[lo*es:hi*es], hout[base[j]*es:base[j+1]*es], roundCounts(j))
		},
		func(j int) error {
			at := base[j]
			for r := range n {
				lo, hi := pc[r][j][0], pc[r][j][1]
				if err := write(m, out, offs[r]+lo, offs[r]+hi, es, hout[at*es:]); err != nil {
					return err
				}
				at += hi - lo
			}
			return nil
		})
}

func (s *staged) ReduceScatter(ctx context.Context, in, out *tensor.Tensor, counts []int, op ReduceOp) error {
	dt, err := sameDevice(s.dev, in, out)
	if err != nil {
		return err
	}
	me, n := s.g.Index(), s.g.Size()
	offs, total, err := offsets(counts)
	if err != nil {
		return err
	}
	if len(counts) != n || in.Len() != total || out.Len() != counts[me] {
		return invalid("reduce_scatter: %d counts for a group of %d, in %d elements (total %d), out %d (count %d)",
			len(counts), n, in.Len(), total, out.Len(), counts[min(me, len(counts)-1)])
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, es := tensor.MemoryOf(in), dt.Size()
	// Staging: each round's pieces of every segment, then this member's output.
	h, err := s.stage(m, (total+counts[me])*es)
	if err != nil {
		return err
	}
	hin, hout := h[:total*es], h[total*es:]
	k := s.rounds(slicesMax(counts), es)
	pc := pieces(counts, k)
	base := roundBases(pc, k)
	return pipeline(k,
		func(j int) error {
			at := base[j]
			for r := range n {
				lo, hi := pc[r][j][0], pc[r][j][1]
				if err := read(m, hin[at*es:], in, offs[r]+lo, offs[r]+hi, es); err != nil {
					return err
				}
				at += hi - lo
			}
			return nil
		},
		func(j int) error {
			c := make([]int, n)
			for r := range c {
				c[r] = pc[r][j][1] - pc[r][j][0]
			}
			lo, hi := pc[me][j][0], pc[me][j][1]
			return hostReduceScatter(ctx, s.g, dt, hin[base[j]*es:base[j+1]*es], hout[lo*es:hi*es], c, op)
		},
		func(j int) error {
			lo, hi := pc[me][j][0], pc[me][j][1]
			return write(m, out, lo, hi, es, hout[lo*es:])
		})
}

func (s *staged) AllToAll(ctx context.Context, send *tensor.Tensor, sendCounts []int, recv *tensor.Tensor, recvCounts []int) error {
	dt, err := sameDevice(s.dev, send, recv)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, es := tensor.MemoryOf(send), dt.Size()
	ns, nr := send.Len(), recv.Len()
	h, err := s.stage(m, (ns+nr)*es)
	if err != nil {
		return err
	}
	hs, hr := h[:ns*es], h[ns*es:]
	return pipeline(1,
		func(int) error { return read(m, hs, send, 0, ns, es) },
		func(int) error {
			if dt == tensor.Float64 {
				return AllToAll(ctx, s.g, asElems[float64](hs), sendCounts, asElems[float64](hr), recvCounts)
			}
			return AllToAll(ctx, s.g, asElems[float32](hs), sendCounts, asElems[float32](hr), recvCounts)
		},
		func(int) error { return write(m, recv, 0, nr, es, hr) })
}

// roundBases returns where round j's pieces start when every round's pieces
// are laid out one after the other in member order (element offsets; k+1
// values).
func roundBases(pc [][][2]int, k int) []int {
	base := make([]int, k+1)
	for j := range k {
		base[j+1] = base[j]
		for r := range pc {
			base[j+1] += pc[r][j][1] - pc[r][j][0]
		}
	}
	return base
}

func slicesMax(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// The host collectives on staging bytes of dtype dt.

func hostAllReduce(ctx context.Context, g *Group, dt tensor.DType, b []byte, op ReduceOp) error {
	if dt == tensor.Float64 {
		return AllReduce(ctx, g, asElems[float64](b), op)
	}
	return AllReduce(ctx, g, asElems[float32](b), op)
}

func hostBroadcast(ctx context.Context, g *Group, dt tensor.DType, b []byte, root int) error {
	if dt == tensor.Float64 {
		return Broadcast(ctx, g, asElems[float64](b), root)
	}
	return Broadcast(ctx, g, asElems[float32](b), root)
}

func hostAllGather(ctx context.Context, g *Group, dt tensor.DType, in, out []byte, counts []int) error {
	if dt == tensor.Float64 {
		return AllGather(ctx, g, asElems[float64](in), asElems[float64](out), counts)
	}
	return AllGather(ctx, g, asElems[float32](in), asElems[float32](out), counts)
}

func hostReduceScatter(ctx context.Context, g *Group, dt tensor.DType, in, out []byte, counts []int, op ReduceOp) error {
	if dt == tensor.Float64 {
		return ReduceScatter(ctx, g, asElems[float64](in), asElems[float64](out), counts, op)
	}
	return ReduceScatter(ctx, g, asElems[float32](in), asElems[float32](out), counts, op)
}
