package stage

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/tensor"
)

// Wire is how a stage's activations and gradients travel to its
// neighbours. The zero Wire is host float32 tensors over the pp group's
// transport (collective.Send and Recv on a two-rank group per neighbour).
// A Wire with Mem sends tensors of Mem's device and DType as they are
// (no copy to the host and back where the device's collective library
// moves them itself): through the World's links with each neighbour
// (collective.World.Link, a communicator per direction: NCCL's send and
// receive between GPUs, each link on a stream of its own; staged
// otherwise).
type Wire struct {
	Mem   tensor.Memory
	DType tensor.DType
}

// Wired is a Stage or Evaluator whose tensors travel on a Wire of its own;
// one that is not has the zero Wire.
type Wired interface{ Wire() Wire }

func wireOf(x any) Wire {
	if w, ok := x.(Wired); ok {
		return w.Wire()
	}
	return Wire{}
}

func (w Wire) device() bool { return w.Mem != nil }

// same says whether o is w: the same dtype, on the host both or on one
// device (Memory values need not be comparable).
func (w Wire) same(o Wire) bool {
	return w.DType == o.DType && w.device() == o.device() && (!w.device() || w.Mem.Device() == o.Mem.Device())
}

// String names the wire in errors: "host float32" or "bfloat16 on cuda:0".
func (w Wire) String() string {
	if !w.device() {
		return "host float32"
	}
	return fmt.Sprintf("%v on %v", w.DType, w.Mem.Device())
}

// alloc is a tensor of shape to receive into.
func (w Wire) alloc(shape []int) (*tensor.Tensor, error) {
	if !w.device() {
		return tensor.New(tensor.Float32, shape...), nil
	}
	return w.Mem.Alloc(w.DType, shape...)
}

// free gives back a device tensor the wire carried once nothing uses it.
func (w Wire) free(t *tensor.Tensor) {
	if w.device() && t != nil {
		w.Mem.Free(t)
	}
}

// fits says what is wrong with t as the wire's tensor of shape ("of shape
// [2 8], want [3 8]"), "" if nothing.
func (w Wire) fits(t *tensor.Tensor, shape []int) string {
	switch {
	case t == nil:
		return "no tensor"
	case !w.device() && (!t.OnHost() || t.DType() != tensor.Float32),
		w.device() && (t.Device() != w.Mem.Device() || t.DType() != w.DType):
		return fmt.Sprintf("of %v on %v, want %v", t.DType(), t.Device(), w)
	case !slices.Equal(t.Shape(), shape):
		return fmt.Sprintf("of shape %v, want %v", t.Shape(), shape)
	}
	return ""
}

// link is the traffic with one neighbour, both ways.
type link struct {
	w       Wire
	g       *collective.Group       // host wire: the pair's group
	out, in collective.Communicator // device wire: a communicator per direction
	peer    int                     // host wire: the neighbour's index in g
}

// links makes the stage's links with its neighbours in the pp group g (this
// stage g's index s): prev with stage s−1 (activations in, gradients out),
// next with s+1 (activations out, gradients in); nil where there is no
// neighbour. With ring (chunks: Interleaved), stage 0's neighbour before is
// the last stage, and the last's after is stage 0; of two stages, each is
// the other's neighbour both ways, and prev and next are one link. The
// links are made in order of their lower rank, then their higher, on
// every stage, so that no stage waits for a link its peer makes after one
// that waits for it.
func links(ctx context.Context, g *collective.Group, w Wire, ring bool) (prev, next *link, err error) {
	ranks, s := g.Ranks(), g.Index()
	p := len(ranks)
	pair := func(peer int) (*link, error) {
		if !w.device() {
			lo, hi := min(ranks[s], ranks[peer]), max(ranks[s], ranks[peer])
			pg, err := g.World().Group(ctx, []int{lo, hi})
			if err != nil {
				return nil, err
			}
			return &link{w: w, g: pg, peer: 1 - pg.Index()}, nil
		}
		o, i, err := g.World().Link(ctx, ranks[peer], w.Mem)
		if err != nil {
			return nil, err
		}
		return &link{w: w, out: o, in: i}, nil
	}
	before, after := s-1, s+1
	if ring {
		before, after = (s-1+p)%p, (s+1)%p
	}
	var peers []int
	for _, q := range []int{before, after} {
		if q >= 0 && q < p && q != s && !slices.Contains(peers, q) {
			peers = append(peers, q)
		}
	}
	key := func(q int) [2]int { return [2]int{min(ranks[s], ranks[q]), max(ranks[s], ranks[q])} }
	slices.SortFunc(peers, func(a, b int) int {
		ka, kb := key(a), key(b)
		return cmp.Or(cmp.Compare(ka[0], kb[0]), cmp.Compare(ka[1], kb[1]))
	})
	for _, q := range peers {
		l, err := pair(q)
		if err != nil {
			return nil, nil, err
		}
		if q == before {
			prev = l
		}
		if q == after {
			next = l
		}
	}
	return prev, next, nil
}

// send sends t to the neighbour.
func (l *link) send(ctx context.Context, t *tensor.Tensor) error {
	if l.out != nil {
		return l.out.Send(ctx, t, 1)
	}
	return collective.Send(ctx, l.g, t.Float32(), l.peer)
}

// recv receives the neighbour's next tensor into t.
func (l *link) recv(ctx context.Context, t *tensor.Tensor) error {
	if l.in != nil {
		return l.in.Recv(ctx, t, 0)
	}
	return collective.Recv(ctx, l.g, t.Float32(), l.peer)
}
