package stage

import (
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

// link is one direction of the traffic with one neighbour.
type link struct {
	w    Wire
	g    *collective.Group       // host wire: the pair's group, both directions
	c    collective.Communicator // device wire: this direction's own
	peer int                     // the neighbour's index in g or c
}

// links makes the stage's links with its neighbours in the pp group g (this
// stage g's index s): from stage s−1 (activations in) and to it (gradients
// out), then to s+1 (activations out) and from it (gradients in); nil
// where there is no neighbour. Made with s−1 first, then with s+1, the
// handshakes chain from stage 0 on.
func links(ctx context.Context, g *collective.Group, w Wire) (actIn, gradOut, actOut, gradIn *link, err error) {
	ranks, s := g.Ranks(), g.Index()
	pair := func(peer int) (out, in *link, err error) {
		if !w.device() {
			lo, hi := min(ranks[s], ranks[peer]), max(ranks[s], ranks[peer])
			pg, err := g.World().Group(ctx, []int{lo, hi})
			if err != nil {
				return nil, nil, err
			}
			p := 1 - pg.Index()
			return &link{w: w, g: pg, peer: p}, &link{w: w, g: pg, peer: p}, nil
		}
		o, i, err := g.World().Link(ctx, ranks[peer], w.Mem)
		if err != nil {
			return nil, nil, err
		}
		return &link{w: w, c: o, peer: 1}, &link{w: w, c: i, peer: 0}, nil
	}
	if s > 0 {
		if gradOut, actIn, err = pair(s - 1); err != nil {
			return
		}
	}
	if s+1 < len(ranks) {
		actOut, gradIn, err = pair(s + 1)
	}
	return
}

// send sends t to the neighbour.
func (l *link) send(ctx context.Context, t *tensor.Tensor) error {
	if l.c != nil {
		return l.c.Send(ctx, t, l.peer)
	}
	return collective.Send(ctx, l.g, t.Float32(), l.peer)
}

// recv receives the neighbour's next tensor into t.
func (l *link) recv(ctx context.Context, t *tensor.Tensor) error {
	if l.c != nil {
		return l.c.Recv(ctx, t, l.peer)
	}
	return collective.Recv(ctx, l.g, t.Float32(), l.peer)
}
