package spmd

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/meshrun/meshrun/placement"
)

// The mixture-of-experts layer's sharding rules (docs/moe.md). Its ops are
// not einsums: which token goes where depends on the data. So the rules are
// written out once here, for every mesh of the dims dp (data), ep (experts)
// and tp (the experts' FFN), and the runtime (package moe) runs exactly the
// collectives PlanMoE lists, in its order.
//
//	router      x [T,H] S(0) over dp and ep, R over tp; router [E,H] R:
//	            logits [T,E] S(0) like x, no collective. Backward: drouter
//	            partial over dp and ep (all-reduced), dx from the logits local.
//	top-k       per token, local; the routing statistics (tokens per expert,
//	            the probabilities' sums) all-gathered over dp and ep: the aux
//	            loss and the capacity (global slot order) need them.
//	dispatch    the kept slots' rows sent to the ep rank owning their expert:
//	            the counts first (host all-to-all), then the rows (device
//	            all-to-all) over ep. Backward: the output gradient the same way.
//	experts     w1 [E,F,H] S(0) over ep, S(1) over tp; b1 [E,F] S(0), S(1);
//	            w2 [E,H,F] S(0), S(2); b2 [E,H] S(0), R: a grouped GEMM per
//	            layer, its output partial over tp (all-reduced; b2 added by
//	            tp rank 0). Backward: the input gradient partial over tp
//	            (all-reduced); the weights' gradients partial over dp
//	            (all-reduced).
//	combine     the rows sent back (all-to-all over ep, the splits swapped),
//	            weighted by the gates and summed per token. Backward: the rows'
//	            gradient (the gates') and the gates' (dot products) local.

// ErrMoEMesh: a mesh whose dims are not named dp, ep and tp (each at most
// once), or that splits something a layer cannot split.
var ErrMoEMesh = errors.New("spmd: mesh does not fit a mixture-of-experts layer")

// MoEShape are a layer's sizes: T tokens of H features, E experts of F hidden
// features, K experts per token, Capacity the capacity factor (0: dropless).
type MoEShape struct {
	T, H, F, E, K int
	Capacity      float64
}

// MoECapacity is the slots each expert keeps, ceil(T·K·c/E); 0 when dropless.
func (s MoEShape) MoECapacity() int {
	if s.Capacity == 0 || s.E == 0 {
		return 0
	}
	return int(math.Ceil(float64(s.T) * float64(s.K) * s.Capacity / float64(s.E)))
}

// MoEComm is one collective of a layer's step, on every rank of the mesh.
type MoEComm struct {
	Phase    string `json:"phase"`  // forward or backward
	Op       string `json:"op"`     // router, top-k, dispatch, experts, combine
	Kind     string `json:"kind"`   // all_gather, all_to_all, all_reduce
	Tensor   string `json:"tensor"` // what it moves
	MeshDims []int  `json:"mesh_dims"`
	// Bytes is what rank 0 sends to other ranks: with balanced routing where
	// the count depends on the data (each expert gets T·K/E slots).
	Bytes int64 `json:"bytes"`
	// Worst is the most any rank receives from the others when every token
	// goes to the same experts (bounded by the capacity); Bytes where the
	// count does not depend on the data.
	Worst int64 `json:"worst_bytes"`
	// Host marks the collectives on host memory (counts, statistics).
	Host bool `json:"host,omitempty"`
}

// MoEPlan is how a layer runs on a mesh: the tensors' layouts and the
// collectives of one step, forward then backward, in the order they run.
type MoEPlan struct {
	Mesh  placement.Mesh
	Shape MoEShape
	// DP, EP and TP are the mesh dims (-1: absent, size 1).
	DP, EP, TP                    int
	X, Router, W1, B1, W2, B2, DY placement.Spec
	Comms                         []MoEComm
}

// Size is a mesh dim's extent (1 when absent).
func (p *MoEPlan) Size(dim int) int {
	if dim < 0 {
		return 1
	}
	return p.Mesh.Dim(dim)
}

// TokenDims are the mesh dims the tokens are split over (dp, ep).
func (p *MoEPlan) TokenDims() []int { return present(p.DP, p.EP) }

func present(dims ...int) []int {
	var out []int
	for _, d := range dims {
		if d >= 0 {
			out = append(out, d)
		}
	}
	slices.Sort(out)
	return out
}

// Coord is rank's coordinate along dim (0 when absent).
func (p *MoEPlan) Coord(rank, dim int) int {
	if dim < 0 {
		return 0
	}
	return p.Mesh.Coords(rank)[dim]
}

// Experts is the first expert rank holds and how many.
func (p *MoEPlan) Experts(rank int) (first, n int) {
	return placement.ShardRange(p.Shape.E, p.Size(p.EP), p.Coord(rank, p.EP), placement.Balanced)
}

// ExpertOwner is the ep coordinate that holds expert e.
func (p *MoEPlan) ExpertOwner(e int) int {
	for r := range p.Size(p.EP) {
		if f, n := placement.ShardRange(p.Shape.E, p.Size(p.EP), r, placement.Balanced); e >= f && e < f+n {
			return r
		}
	}
	return -1
}

// PlanMoE plans a layer of shape s on mesh; elemSize is the activations'
// element size in bytes (4 for float32). The mesh's dims must be named dp, ep
// or tp; any may be missing.
func PlanMoE(mesh placement.Mesh, s MoEShape, elemSize int) (*MoEPlan, error) {
	if s.T <= 0 || s.H <= 0 || s.F <= 0 || s.E <= 0 || s.K <= 0 || s.K > s.E {
		return nil, fmt.Errorf("%w: mixture of experts T=%d H=%d F=%d E=%d k=%d (every size >= 1, k <= E)", ErrShape, s.T, s.H, s.F, s.E, s.K)
	}
	if s.Capacity < 0 || math.IsNaN(s.Capacity) || math.IsInf(s.Capacity, 0) {
		return nil, fmt.Errorf("%w: capacity factor %v (0: dropless, else > 0)", ErrShape, s.Capacity)
	}
	p := &MoEPlan{Mesh: mesh, Shape: s, DP: -1, EP: -1, TP: -1}
	for i, name := range mesh.Names() {
		dst := map[string]*int{"dp": &p.DP, "ep": &p.EP, "tp": &p.TP}[name]
		if dst == nil || *dst >= 0 {
			return nil, fmt.Errorf("%w: mesh %s: dim %d is %q; name the dims dp, ep and tp, each at most once", ErrMoEMesh, mesh, i, name)
		}
		*dst = i
	}
	if err := p.specs(); err != nil {
		return nil, err
	}
	p.comms(elemSize)
	return p, nil
}

// specs lays out the operands (docs/moe.md).
func (p *MoEPlan) specs() error {
	s, n := p.Shape, p.Mesh.NDim()
	layout := func(shape []int, at map[int]placement.Placement) (placement.Spec, error) {
		ps := make([]placement.Placement, n)
		for i := range ps {
			ps[i] = placement.Replicate{}
			if q, ok := at[i]; ok {
				ps[i] = q
			}
		}
		return placement.NewSpec(shape, p.Mesh, ps...)
	}
	on := func(pairs ...any) map[int]placement.Placement {
		m := map[int]placement.Placement{}
		for i := 0; i < len(pairs); i += 2 {
			if d := pairs[i].(int); d >= 0 {
				m[d] = placement.Shard{Dim: pairs[i+1].(int)}
			}
		}
		return m
	}
	var err error
	for _, t := range []struct {
		dst   *placement.Spec
		shape []int
		at    map[int]placement.Placement
	}{
		{&p.X, []int{s.T, s.H}, on(p.DP, 0, p.EP, 0)},
		{&p.DY, []int{s.T, s.H}, on(p.DP, 0, p.EP, 0)},
		{&p.Router, []int{s.E, s.H}, nil},
		{&p.W1, []int{s.E, s.F, s.H}, on(p.EP, 0, p.TP, 1)},
		{&p.B1, []int{s.E, s.F}, on(p.EP, 0, p.TP, 1)},
		{&p.W2, []int{s.E, s.H, s.F}, on(p.EP, 0, p.TP, 2)},
		{&p.B2, []int{s.E, s.H}, on(p.EP, 0)},
	} {
		if *t.dst, err = layout(t.shape, t.at); err != nil {
			return fmt.Errorf("%w: %v", ErrMoEMesh, err)
		}
	}
	return nil
}

// comms lists one step's collectives, with rank 0's bytes.
func (p *MoEPlan) comms(elem int) {
	s := p.Shape
	ep, tp, dp := p.Size(p.EP), p.Size(p.TP), p.Size(p.DP)
	tl := int64(p.X.LocalShape(0)[0])
	_, el := p.Experts(0)
	h, k := int64(s.H), int64(s.K)
	// Balanced routing: each expert gets tl·k/E of each rank's slots.
	send := tl * k * int64(s.E-el) / int64(s.E)
	recv := tl * k * int64(el) / int64(s.E) * int64(ep)
	// Worst: every token of the ep group to the experts of one rank.
	worstRows := tl * k * int64(ep-1)
	if c := int64(s.MoECapacity()); c > 0 {
		worstRows = min(worstRows, c*int64(el))
	}
	add := func(phase, op, kind, tensor string, dims []int, bytes, worst int64, host bool) {
		if len(dims) == 0 || p.GroupSize(dims) == 1 {
			return
		}
		p.Comms = append(p.Comms, MoEComm{phase, op, kind, tensor, dims, bytes, worst, host})
	}
	tok := p.TokenDims()
	stats := int64(2*s.E+1) * 8 * int64(p.GroupSize(tok)-1)
	add("forward", "top-k", "all_gather", "routing", tok, stats, stats, true)
	counts := int64(s.E-el) * 8
	add("forward", "dispatch", "all_to_all", "counts", present(p.EP), counts, counts, true)
	rows := func(n int64) int64 { return n * h * int64(elem) }
	add("forward", "dispatch", "all_to_all", "x", present(p.EP), rows(send), rows(worstRows), false)
	ar := func(n int64) int64 { return 2 * rows(n) * int64(tp-1) / int64(tp) } // a ring all-reduce
	add("forward", "experts", "all_reduce", "y_experts", present(p.TP), ar(recv), ar(worstRows+tl*k), false)
	add("forward", "combine", "all_to_all", "y", present(p.EP), rows(send), rows(worstRows), false)
	add("backward", "combine", "all_to_all", "dy", present(p.EP), rows(send), rows(worstRows), false)
	add("backward", "experts", "all_reduce", "dx_experts", present(p.TP), ar(recv), ar(worstRows+tl*k), false)
	add("backward", "dispatch", "all_to_all", "dx", present(p.EP), rows(send), rows(worstRows), false)
	rb := 2 * int64(s.E) * h * int64(elem) * int64(p.GroupSize(tok)-1) / int64(p.GroupSize(tok))
	add("backward", "router", "all_reduce", "drouter", tok, rb, rb, false)
	for _, w := range []struct {
		name string
		spec placement.Spec
	}{{"dw1", p.W1}, {"db1", p.B1}, {"dw2", p.W2}, {"db2", p.B2}} {
		n, _ := placement.ShapeElems(w.spec.LocalShape(0))
		b := 2 * n * int64(elem) * int64(dp-1) / int64(dp)
		add("backward", "experts", "all_reduce", w.name, present(p.DP), b, b, false)
	}
}

// GroupSize is the ranks of a group along dims.
func (p *MoEPlan) GroupSize(dims []int) int {
	n := 1
	for _, d := range dims {
		n *= p.Mesh.Dim(d)
	}
	return n
}
