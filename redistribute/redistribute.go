// Package redistribute executes placement plans on tensors: it turns each step
// of a plan (package placement) into the collective calls (package collective)
// of the step's mesh group, and packs and unpacks the boxes of the shards it
// moves. It sits above both: collective moves buffers between ranks and knows
// no placements, placement plans steps and moves no data.
package redistribute

import (
	"context"
	"fmt"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// Executed records one step as this rank ran it, for comparison with the plan
// (placement.Step.InputElems) and with placement/placementref's traffic.
type Executed struct {
	Kind       placement.StepKind
	MeshDims   []int
	Group      []int // world ranks of the group, in group order
	InputElems int64 // elements this rank passed in
	Bytes      int64 // InputElems times the element size
	Algorithm  string
}

// Alloc gives Execute the tensors it writes, so that a caller running the same
// plan step after step can hand back the same buffers: key names the buffer
// within the plan (stable from call to call), and the tensor must be a flat
// tensor of n elements of dt in memory m. Its contents need not be zero.
type Alloc func(m tensor.Memory, key string, dt tensor.DType, n int) (*tensor.Tensor, error)

// NewAlloc allocates fresh tensors each time.
func NewAlloc(m tensor.Memory, _ string, dt tensor.DType, n int) (*tensor.Tensor, error) {
	return m.Alloc(dt, n)
}

// MeshGroup is the group of w's rank along mesh dims (one group, ranks
// ordered as placement.Mesh.Group orders them). The mesh must hold the whole
// world.
func MeshGroup(ctx context.Context, w *collective.World, mesh placement.Mesh, dims ...int) (*collective.Group, error) {
	if err := mesh.Validate(w.Size()); err != nil {
		return nil, fmt.Errorf("%w: %v", collective.ErrInvalid, err)
	}
	for _, d := range dims {
		if d < 0 || d >= mesh.NDim() {
			return nil, fmt.Errorf("%w: mesh %s has no dim %d", collective.ErrInvalid, mesh, d)
		}
	}
	return w.Group(ctx, mesh.Group(w.Rank(), dims...))
}

// Execute runs a redistribution plan on this rank's local shard, a tensor of any
// device: the only code that turns placement steps into collective calls. local
// is dense row-major with steps[0].From.LocalShape(rank) elements; the result
// has steps[len-1].To.LocalShape(rank) elements (flat: reshape it). local may be
// overwritten (all-reduce works in place). The mesh must hold the whole world;
// every rank must execute the same steps.
//
// Data stays on local's device: boxes are packed and unpacked there (by its
// Memory's 2-D copies), and each collective goes to the Communicator of the
// step's group for that device (host, staged or nccl). alloc provides the
// tensors Execute writes (nil: NewAlloc).
//
// Boxes are handled in general: a shard is the box Spec.LocalBox(rank); data
// moving between boxes is packed and unpacked along any tensor dim, and a
// contiguous fast path skips the copies when the boxes are consecutive slices
// (sharding along dim 0, or outer dims of extent 1).
func Execute(ctx context.Context, w *collective.World, steps []placement.Step, local *tensor.Tensor, alloc Alloc) (*tensor.Tensor, []Executed, error) {
	if alloc == nil {
		alloc = NewAlloc
	}
	var log []Executed
	rank := w.Rank()
	for i, st := range steps {
		if err := st.From.Mesh.Validate(w.Size()); err != nil {
			return nil, log, fmt.Errorf("%w: step %d: %v", collective.ErrInvalid, i, err)
		}
		if want := st.From.LocalElems(rank); int64(local.Len()) != want {
			return nil, log, fmt.Errorf("%w: step %d (%s): rank %d holds %d elements, want %d", collective.ErrInvalid, i, st, rank, local.Len(), want)
		}
		ex := Executed{Kind: st.Kind, MeshDims: append([]int(nil), st.MeshDims...), InputElems: int64(local.Len()), Algorithm: "local"}
		ex.Bytes = ex.InputElems * int64(local.DType().Size())
		x := &stepExec{w: w, st: st, mem: tensor.MemoryOf(local), es: local.DType().Size(), alloc: alloc, key: fmt.Sprintf("step%d/", i)}
		out, c, err := x.run(ctx, local)
		if c != nil {
			ex.Group = c.Ranks()
			ex.Algorithm = c.Algorithm()
		}
		if err != nil {
			return nil, log, err
		}
		log = append(log, ex)
		local = out
	}
	return local, log, nil
}

// stepExec is one step on one rank.
type stepExec struct {
	w     *collective.World
	st    placement.Step
	mem   tensor.Memory
	es    int
	alloc Alloc
	key   string
}

func (x *stepExec) get(name string, dt tensor.DType, n int) (*tensor.Tensor, error) {
	return x.alloc(x.mem, x.key+name, dt, n)
}

// maxPitch is the largest pitch in bytes box2D hands a 2-D copy: cuMemcpy2D
// refuses pitches from 2 GiB on. A block's rows are that far apart only when
// the dims folded into its runs are that large, and are then copied one by
// one.
var maxPitch = 1<<31 - 1

// box2D copies the intersection of the src box (starting at element srcAt of
// src) and the dst box (from element dstAt of dst), as 2-D copies on their
// memory.
func (x *stepExec) box2D(dst *tensor.Tensor, dstAt int, db tensor.Box, src *tensor.Tensor, srcAt int, sb tensor.Box) error {
	es := x.es
	return tensor.Blocks(db.Intersect(sb), db, sb, func(d, s, dPitch, sPitch, n, rows int) error {
		if rows > 1 && max(dPitch, sPitch)*es > maxPitch {
			for r := 0; r < rows; r++ {
				if err := x.mem.Copy2D(dst, (dstAt+d+r*dPitch)*es, n*es, src, (srcAt+s+r*sPitch)*es, n*es, n*es, 1); err != nil {
					return err
				}
			}
			return nil
		}
		return x.mem.Copy2D(dst, (dstAt+d)*es, dPitch*es, src, (srcAt+s)*es, sPitch*es, n*es, rows)
	})
}

func (x *stepExec) run(ctx context.Context, local *tensor.Tensor) (*tensor.Tensor, collective.Communicator, error) {
	st := x.st
	if st.GroupSize() == 1 {
		// A group of one: every kind of step leaves the data as it is (the shard
		// of a dim split once is the dim; the owner of a partial is the rank).
		return local, nil, nil
	}
	w, dt := x.w, local.DType()
	rank := w.Rank()
	mesh := st.From.Mesh
	from, to := st.From.LocalBox(rank), st.To.LocalBox(rank)
	switch st.Kind {
	case placement.LocalSlice:
		out, err := x.get("out", dt, to.Len())
		if err != nil {
			return nil, nil, err
		}
		return out, nil, x.box2D(out, 0, to, local, 0, from)
	case placement.OwnerPartial:
		if st.Op == placement.Sum && mesh.Coords(rank)[st.MeshDims[0]] != 0 {
			return local, nil, x.mem.Zero(local, 0, local.Bytes())
		}
		return local, nil, nil
	}
	group := mesh.Group(rank, st.MeshDims...)
	c, err := w.Communicator(ctx, group, x.mem)
	if err != nil {
		return nil, nil, err
	}
	switch st.Kind {
	case placement.AllReduce:
		return local, c, c.AllReduce(ctx, local, st.Op)
	case placement.AllGather:
		return x.allGather(ctx, c, group, local, to)
	case placement.ReduceScatter:
		return x.reduceScatter(ctx, c, group, local, from, to)
	case placement.AllToAll:
		return x.allToAll(ctx, c, group, local, from, to)
	}
	return nil, c, fmt.Errorf("%w: step kind %v", collective.ErrInvalid, st.Kind)
}

// boxes returns the shards of spec on the ranks of group and their element
// counts.
func boxes(spec placement.Spec, group []int) ([]tensor.Box, []int) {
	bs := make([]tensor.Box, len(group))
	counts := make([]int, len(group))
	for j, r := range group {
		bs[j] = spec.LocalBox(r)
		counts[j] = bs[j].Len()
	}
	return bs, counts
}

// clip intersects each of bs with b and returns their new counts.
func clip(bs []tensor.Box, b tensor.Box) []int {
	counts := make([]int, len(bs))
	for j := range bs {
		bs[j] = bs[j].Intersect(b)
		counts[j] = bs[j].Len()
	}
	return counts
}

func (x *stepExec) allGather(ctx context.Context, c collective.Communicator, group []int, local *tensor.Tensor, to tensor.Box) (*tensor.Tensor, collective.Communicator, error) {
	dt := local.DType()
	bs, counts := boxes(x.st.From, group)
	out, err := x.get("out", dt, to.Len())
	if err != nil {
		return nil, c, err
	}
	if contiguous(bs, to) {
		return out, c, c.AllGather(ctx, local, out, counts)
	}
	tmp, err := x.get("gathered", dt, sum(counts))
	if err != nil {
		return nil, c, err
	}
	if err := c.AllGather(ctx, local, tmp, counts); err != nil {
		return nil, c, err
	}
	off := 0
	for j := range bs {
		if err := x.box2D(out, 0, to, tmp, off, bs[j]); err != nil {
			return nil, c, err
		}
		off += counts[j]
	}
	return out, c, nil
}

func (x *stepExec) reduceScatter(ctx context.Context, c collective.Communicator, group []int, local *tensor.Tensor, from, to tensor.Box) (*tensor.Tensor, collective.Communicator, error) {
	dt := local.DType()
	bs, counts := boxes(x.st.To, group)
	out, err := x.get("out", dt, to.Len())
	if err != nil {
		return nil, c, err
	}
	in := local
	if !contiguous(bs, from) {
		if in, err = x.get("packed", dt, sum(counts)); err != nil {
			return nil, c, err
		}
		off := 0
		for j := range bs {
			if err := x.box2D(in, off, bs[j], local, 0, from); err != nil {
				return nil, c, err
			}
			off += counts[j]
		}
	}
	return out, c, c.ReduceScatter(ctx, in, out, counts, x.st.Op)
}

func (x *stepExec) allToAll(ctx context.Context, c collective.Communicator, group []int, local *tensor.Tensor, from, to tensor.Box) (*tensor.Tensor, collective.Communicator, error) {
	dt := local.DType()
	// What this rank sends member j is the part of j's new shard it holds;
	// what it receives from j, the part of j's old shard its new one holds.
	sendBoxes, _ := boxes(x.st.To, group)
	sendCounts := clip(sendBoxes, from)
	recvBoxes, _ := boxes(x.st.From, group)
	recvCounts := clip(recvBoxes, to)
	send, err := x.get("send", dt, sum(sendCounts))
	if err != nil {
		return nil, c, err
	}
	off := 0
	for j := range sendBoxes {
		if err := x.box2D(send, off, sendBoxes[j], local, 0, from); err != nil {
			return nil, c, err
		}
		off += sendCounts[j]
	}
	recv, err := x.get("recv", dt, sum(recvCounts))
	if err != nil {
		return nil, c, err
	}
	if err := c.AllToAll(ctx, send, sendCounts, recv, recvCounts); err != nil {
		return nil, c, err
	}
	out, err := x.get("out", dt, to.Len())
	if err != nil {
		return nil, c, err
	}
	off = 0
	for j := range recvBoxes {
		if err := x.box2D(out, 0, to, recv, off, recvBoxes[j]); err != nil {
			return nil, c, err
		}
		off += recvCounts[j]
	}
	return out, c, nil
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// contiguous reports whether bs, in order, are consecutive flat ranges that
// exactly tile the box big (so a collective can use the buffer as is).
func contiguous(bs []tensor.Box, big tensor.Box) bool {
	pos := 0
	for _, b := range bs {
		if b.Empty() {
			continue
		}
		start, end := big.Span(b)
		if start != pos || end-start != b.Len() {
			return false
		}
		pos = end
	}
	return pos == big.Len()
}
