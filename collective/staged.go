package collective

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// segmented is one call on a buffer made of one segment per member (counts),
// cut into rounds: round j moves piece j of every segment. The caller holds s.mu.
type segmented struct {
	m              tensor.Memory
	dt             tensor.DType
	es, me, rounds int
	offs           []int      // where each segment starts in the whole buffer
	pc             [][][2]int // piece (r, j): elements [lo, hi) of segment r
	base           []int      // where round j's pieces start, all rounds laid out in turn
	h              []byte     // staging: the rounds' pieces (total), then this member's segment
}

// segmented checks a call whose whole buffer holds every segment and mine this
// member's, and cuts it into rounds.
func (s *staged) segmented(op string, whole, mine *tensor.Tensor, counts []int) (segmented, error) {
	dt, err := sameDevice(s.dev, whole, mine)
	if err != nil {
		return segmented{}, err
	}
	me, n := s.g.Index(), s.g.Size()
	offs, total, err := offsets(counts)
	if err != nil {
		return segmented{}, err
	}
	if len(counts) != n || whole.Len() != total || mine.Len() != counts[me] {
		return segmented{}, invalid("%s: %d counts for a group of %d; the buffer of every segment has %d elements (total %d), this member's %d (count %d)",
			op, len(counts), n, whole.Len(), total, mine.Len(), counts[min(me, len(counts)-1)])
	}
	g := segmented{m: tensor.MemoryOf(whole), dt: dt, es: dt.Size(), me: me, offs: offs}
	g.rounds = s.rounds(slices.Max(append([]int{0}, counts...)), g.es)
	g.pc = make([][][2]int, n)
	for r, c := range counts {
		g.pc[r] = make([][2]int, g.rounds)
		for j := range g.rounds {
			lo, hi := balanced(c, g.rounds, j)
			g.pc[r][j] = [2]int{lo, hi}
		}
	}
	g.base = make([]int, g.rounds+1)
	for j := range g.rounds {
		g.base[j+1] = g.base[j]
		for r := range n {
			g.base[j+1] += g.pc[r][j][1] - g.pc[r][j][0]
		}
	}
	g.h, err = s.stage(g.m, (total+counts[me])*g.es)
	return g, err
}

// round is round j's pieces in staging, and its counts.
func (g segmented) round(j int) ([]byte, []int) {
	c := make([]int, len(g.pc))
	for r := range c {
		c[r] = g.pc[r][j][1] - g.pc[r][j][0]
	}
	return g.h[g.base[j]*g.es : g.base[j+1]*g.es], c
}

// mine is this member's piece of round j in staging.
func (g segmented) mine(j int) []byte {
	at := g.base[len(g.base)-1]
	lo, hi := g.pc[g.me][j][0], g.pc[g.me][j][1]
	return g.h[(at+lo)*g.es : (at+hi)*g.es]
}

// each copies round j's pieces between the whole buffer t and staging: out of
// the device (toHost) or into it.
func (g segmented) each(t *tensor.Tensor, j int, toHost bool) error {
	at := g.base[j]
	for r := range g.pc {
		lo, hi := g.offs[r]+g.pc[r][j][0], g.offs[r]+g.pc[r][j][1]
		var err error
		if toHost {
			err = read(g.m, g.h[at*g.es:], t, lo, hi, g.es)
		} else {
			err = write(g.m, t, lo, hi, g.es, g.h[at*g.es:])
		}
		if err != nil {
			return err
		}
		at += hi - lo
	}
	return nil
}

// copyMine copies this member's piece of round j between t and staging.
func (g segmented) copyMine(t *tensor.Tensor, j int, toHost bool) error {
	lo, hi := g.pc[g.me][j][0], g.pc[g.me][j][1]
	if toHost {
		return read(g.m, g.mine(j), t, lo, hi, g.es)
	}
	return write(g.m, t, lo, hi, g.es, g.mine(j))
}

func (s *staged) AllGather(ctx context.Context, in, out *tensor.Tensor, counts []int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, err := s.segmented("all_gather", out, in, counts)
	if err != nil {
		return err
	}
	return pipeline(g.rounds,
		func(j int) error { return g.copyMine(in, j, true) },
		func(j int) error {
			round, c := g.round(j)
			return hostAllGather(ctx, s.g, g.dt, g.mine(j), round, c)
		},
		func(j int) error { return g.each(out, j, false) })
}

func (s *staged) ReduceScatter(ctx context.Context, in, out *tensor.Tensor, counts []int, op ReduceOp) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, err := s.segmented("reduce_scatter", in, out, counts)
	if err != nil {
		return err
	}
	return pipeline(g.rounds,
		func(j int) error { return g.each(in, j, true) },
		func(j int) error {
			round, c := g.round(j)
			return hostReduceScatter(ctx, s.g, g.dt, round, g.mine(j), c, op)
		},
		func(j int) error { return g.copyMine(out, j, false) })
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
		func(int) error { return hostAllToAll(ctx, s.g, dt, hs, sendCounts, hr, recvCounts) },
		func(int) error { return write(m, recv, 0, nr, es, hr) })
}

// The host collectives on bytes holding elements of dtype dt.

func hostAllReduce(ctx context.Context, g *Group, dt tensor.DType, b []byte, op ReduceOp) error {
	switch dt {
	case tensor.Float64:
		return AllReduce(ctx, g, asElems[float64](b), op)
	case tensor.BFloat16:
		return AllReduce(ctx, g, asElems[tensor.BF16](b), op)
	}
	return AllReduce(ctx, g, asElems[float32](b), op)
}

func hostBroadcast(ctx context.Context, g *Group, dt tensor.DType, b []byte, root int) error {
	switch dt {
	case tensor.Float64:
		return Broadcast(ctx, g, asElems[float64](b), root)
	case tensor.BFloat16:
		return Broadcast(ctx, g, asElems[tensor.BF16](b), root)
	}
	return Broadcast(ctx, g, asElems[float32](b), root)
}

func hostAllGather(ctx context.Context, g *Group, dt tensor.DType, in, out []byte, counts []int) error {
	switch dt {
	case tensor.Float64:
		return AllGather(ctx, g, asElems[float64](in), asElems[float64](out), counts)
	case tensor.BFloat16:
		return AllGather(ctx, g, asElems[tensor.BF16](in), asElems[tensor.BF16](out), counts)
	}
	return AllGather(ctx, g, asElems[float32](in), asElems[float32](out), counts)
}

func hostReduceScatter(ctx context.Context, g *Group, dt tensor.DType, in, out []byte, counts []int, op ReduceOp) error {
	switch dt {
	case tensor.Float64:
		return ReduceScatter(ctx, g, asElems[float64](in), asElems[float64](out), counts, op)
	case tensor.BFloat16:
		return ReduceScatter(ctx, g, asElems[tensor.BF16](in), asElems[tensor.BF16](out), counts, op)
	}
	return ReduceScatter(ctx, g, asElems[float32](in), asElems[float32](out), counts, op)
}

func hostAllToAll(ctx context.Context, g *Group, dt tensor.DType, send []byte, sendCounts []int, recv []byte, recvCounts []int) error {
	switch dt {
	case tensor.Float64:
		return AllToAll(ctx, g, asElems[float64](send), sendCounts, asElems[float64](recv), recvCounts)
	case tensor.BFloat16:
		return AllToAll(ctx, g, asElems[tensor.BF16](send), sendCounts, asElems[tensor.BF16](recv), recvCounts)
	}
	return AllToAll(ctx, g, asElems[float32](send), sendCounts, asElems[float32](recv), recvCounts)
}
