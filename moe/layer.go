// Package moe runs the mixture-of-experts layer of docs/moe.md on a mesh of
// dims dp, ep and tp, as spmd.PlanMoE lays it out: the router on every rank's
// tokens, the top-k on the host, the tokens dispatched to their experts' ranks
// by a two-phase all-to-all (counts, then rows), the experts as grouped GEMMs
// on the rank's device, and the outputs combined back; the backward runs the
// same collectives with the splits swapped, and every gradient, an idle
// expert's included, is written.
package moe

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrLogits: a router logit that is NaN or infinite.
	ErrLogits = errors.New("moe: router logits not finite")
	// ErrConfig: a layer the rank cannot build (a dtype, shapes of the
	// tensors handed in).
	ErrConfig = errors.New("moe: bad layer")
)

// Config is a layer: its plan on the mesh, the aux loss's coefficient and the
// dtype the kernels compute in.
type Config struct {
	Plan    *spmd.MoEPlan
	AuxCoef float64
	DType   tensor.DType
}

// Params are a layer's parameters, whole (float32 host tensors of the
// global shapes): router [E,H], w1 [E,F,H], b1 [E,F], w2 [E,H,F], b2 [E,H].
type Params struct {
	Router, W1, B1, W2, B2 *tensor.Tensor
}

// Stats are one forward's routing, over all the tokens.
type Stats struct {
	// Routed and Tokens are per expert: the slots routed to it, and the ones
	// it kept.
	Routed, Tokens []int
	Dropped        int
	Aux            float64
	// DispatchBytes is what this rank sent to other ranks in the forward's
	// two token all-to-alls.
	DispatchBytes int64
}

// Comm is a collective the layer ran on this rank, with the bytes it sent.
type Comm struct {
	Phase    string `json:"phase"`
	Op       string `json:"op"`
	Kind     string `json:"kind"`
	Tensor   string `json:"tensor"`
	MeshDims []int  `json:"mesh_dims"`
	Bytes    int64  `json:"bytes"`
}

// Layer is one rank's share of a layer: its parameters' shards, their
// gradients after Backward, and what the backward keeps of the forward.
type Layer struct {
	Config
	rank int
	k    kernels.Compute
	// This rank's shards (the compute dtype, on the device) and their
	// gradients, reduced over the mesh after Backward.
	Router, W1, B1, W2, B2      *tensor.Tensor
	DRouter, DW1, DB1, DW2, DB2 *tensor.Tensor
	// Executed lists the collectives of the last forward and backward.
	Executed []Comm
	e0, el   int // the first expert this rank holds, and how many
	tok0, tl int // the first token, and how many
	bufs     linear.Scratch
	fwd      *forward
}

// State is what a forward keeps for its backward: the layer's scratch and
// its routing. A pipeline stage with several micro-batches in flight gives
// each its own (SwapState).
type State struct {
	bufs linear.Scratch
	fwd  *forward
}

// Bytes is the memory of the tensors the state keeps (nil: none).
func (s *State) Bytes() int64 {
	if s == nil {
		return 0
	}
	return s.bufs.Bytes()
}

// SwapState makes s the layer's state (nil: a fresh one) and returns the
// state it had: a micro-batch's forward and backward then run on s.
func (l *Layer) SwapState(s *State) *State {
	old := &State{bufs: l.bufs, fwd: l.fwd}
	if s == nil {
		s = &State{bufs: linear.Scratch{}}
	}
	l.bufs, l.fwd = s.bufs, s.fwd
	return old
}

// New builds rank's share of the layer from whole parameters.
func New(cfg Config, rank int, k kernels.Compute, p Params) (*Layer, error) {
	if cfg.DType != tensor.Float32 {
		return nil, fmt.Errorf("%w: dtype %v (the layer computes in float32)", ErrConfig, cfg.DType)
	}
	pl := cfg.Plan
	l := &Layer{Config: cfg, rank: rank, k: k, bufs: linear.Scratch{}}
	l.e0, l.el = pl.Experts(rank)
	_, off := pl.X.Local(rank)
	l.tok0, l.tl = off[0], pl.X.LocalShape(rank)[0]
	for _, t := range []struct {
		name       string
		dst, grad  **tensor.Tensor
		whole      *tensor.Tensor
		spec       placement.Spec
		bias, tpB2 bool
	}{
		{"router", &l.Router, &l.DRouter, p.Router, pl.Router, false, false},
		{"w1", &l.W1, &l.DW1, p.W1, pl.W1, false, false},
		{"b1", &l.B1, &l.DB1, p.B1, pl.B1, true, false},
		{"w2", &l.W2, &l.DW2, p.W2, pl.W2, false, false},
		{"b2", &l.B2, &l.DB2, p.B2, pl.B2, true, true},
	} {
		if t.whole == nil || t.whole.DType() != tensor.Float32 || !slices.Equal(t.whole.Shape(), t.spec.Shape) {
			return nil, fmt.Errorf("%w: %s is %v, want float32 %v", ErrConfig, t.name, t.whole, t.spec.Shape)
		}
		sh, err := linear.Shard(t.whole, t.spec, rank)
		if err != nil {
			return nil, err
		}
		if *t.dst, err = tensor.Upload(k, sh); err != nil {
			return nil, err
		}
		if *t.grad, err = k.Alloc(tensor.Float32, sh.Shape()...); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Tokens is the first token this rank holds and how many: x's and dy's rows.
func (l *Layer) Tokens() (first, n int) { return l.tok0, l.tl }

// group is the host group of this rank along dims.
func (l *Layer) group(ctx context.Context, w *collective.World, dims []int) (*collective.Group, error) {
	return w.Group(ctx, l.Plan.Mesh.Group(w.Rank(), dims...))
}

// comm is the device communicator of this rank along dims, for the memory
// the layer's tensors live in (the device's own, which names the device).
func (l *Layer) comm(ctx context.Context, w *collective.World, dims []int) (collective.Communicator, error) {
	return w.Communicator(ctx, l.Plan.Mesh.Group(w.Rank(), dims...), tensor.MemoryOf(l.Router))
}

// record notes a collective the layer ran.
func (l *Layer) record(phase, op, kind, name string, dims []int, bytes int64) {
	l.Executed = append(l.Executed, Comm{phase, op, kind, name, dims, bytes})
}

// PlanMatch reports whether the last step ran the plan's collectives, in its
// order.
func (l *Layer) PlanMatch() bool {
	return slices.EqualFunc(l.Executed, l.Plan.Comms, func(a Comm, b spmd.MoEComm) bool {
		return a.Phase == b.Phase && a.Op == b.Op && a.Kind == b.Kind && a.Tensor == b.Tensor && slices.Equal(a.MeshDims, b.MeshDims)
	})
}

// scratch returns the float32 tensor kept under name, of shape.
func (l *Layer) scratch(name string, shape ...int) (*tensor.Tensor, error) {
	return l.bufs.Get(l.k, name, tensor.Float32, shape)
}

// host returns t's elements on the host: t's own on a cpu device, else a
// copy in buf.
func host(t *tensor.Tensor, buf *[]float32) ([]float32, error) {
	if t.OnHost() {
		return t.Float32(), nil
	}
	if cap(*buf) < t.Len() {
		*buf = make([]float32, t.Len())
	}
	*buf = (*buf)[:t.Len()]
	if t.Len() == 0 {
		return *buf, nil
	}
	h, err := tensor.FromFloat32(*buf, t.Len())
	if err != nil {
		return nil, err
	}
	return *buf, tensor.MemoryOf(t).Read(tensor.HostBytes(h), t, 0, tensor.Transfer)
}

// store writes data, which host returned for t, back into t (nothing to do
// on a cpu device).
func store(t *tensor.Tensor, data []float32) error {
	if t.OnHost() || len(data) == 0 {
		return nil
	}
	h, err := tensor.FromFloat32(data, len(data))
	if err != nil {
		return err
	}
	return tensor.MemoryOf(t).Write(t, 0, tensor.HostBytes(h), tensor.Transfer)
}

// copyRows copies n rows of width elements from src row s to dst row d on
// the device.
func copyRows(dst *tensor.Tensor, d int, src *tensor.Tensor, s, n, width int) error {
	if n == 0 || width == 0 {
		return nil
	}
	b := width * 4
	return tensor.MemoryOf(dst).Copy2D(dst, d*b, b, src, s*b, b, b, n)
}

// Gather assembles a tensor laid out as spec from every rank's local one, on
// every rank (all ranks must call it).
func Gather(ctx context.Context, w *collective.World, spec placement.Spec, local *tensor.Tensor) (*tensor.Tensor, error) {
	h, err := tensor.Download(local)
	if err != nil {
		return nil, err
	}
	return linear.Gather(ctx, w, spec, h)
}
