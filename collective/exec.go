package collective

import (
	"context"
	"fmt"

	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// Executed records one step as this rank ran it, for comparison with the plan
// (placement.Step.InputElems) and with placement/sim's traffic.
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
// Boxes are handled in general: a shard is the box Spec.Local(rank) (shape and
// global offset); data moving between boxes is packed and unpacked along any
// tensor dim, and a contiguous fast path skips the copies when the boxes are
// consecutive slices (sharding along dim 0, or outer dims of extent 1).
func Execute(ctx context.Context, w *World, steps []placement.Step, local *tensor.Tensor, alloc Alloc) (*tensor.Tensor, []Executed, error) {
	if alloc == nil {
		alloc = NewAlloc
	}
	var log []Executed
	rank := w.Rank()
	for i, st := range steps {
		if err := st.From.Mesh.Validate(w.Size()); err != nil {
			return nil, log, fmt.Errorf("%w: step %d: %v", ErrInvalid, i, err)
		}
		if want := st.From.LocalElems(rank); int64(local.Len()) != want {
			return nil, log, fmt.Errorf("%w: step %d (%s): rank %d holds %d elements, want %d", ErrInvalid, i, st, rank, local.Len(), want)
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

func prod(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// stepExec is one step on one rank.
type stepExec struct {
	w     *World
	st    placement.Step
	mem   tensor.Memory
	es    int
	alloc Alloc
	key   string
}

func (x *stepExec) get(name string, dt tensor.DType, n int) (*tensor.Tensor, error) {
	return x.alloc(x.mem, x.key+name, dt, n)
}

// box2D copies the intersection of the src box (shape ss at global offset so,
// starting at element srcAt of src) and the dst box (ds at do, from element
// dstAt of dst), as 2-D copies on their memory.
func (x *stepExec) box2D(dst *tensor.Tensor, dstAt int, ds, do []int, src *tensor.Tensor, srcAt int, ss, so []int) error {
	es := x.es
	return copyBox(ds, do, ss, so, func(di, si, pitchD, pitchS, run, rows int) error {
		return x.mem.Copy2D(dst, (dstAt+di)*es, pitchD*es, src, (srcAt+si)*es, pitchS*es, run*es, rows)
	})
}

func (x *stepExec) run(ctx context.Context, local *tensor.Tensor) (*tensor.Tensor, Communicator, error) {
	st := x.st
	if st.GroupSize() == 1 {
		// A group of one: every kind of step leaves the data as it is (the shard
		// of a dim split once is the dim; the owner of a partial is the rank).
		return local, nil, nil
	}
	w, dt := x.w, local.DType()
	rank := w.Rank()
	mesh := st.From.Mesh
	fs, fo := st.From.Local(rank)
	ts, to := st.To.Local(rank)
	switch st.Kind {
	case placement.LocalSlice:
		out, err := x.get("out", dt, prod(ts))
		if err != nil {
			return nil, nil, err
		}
		return out, nil, x.box2D(out, 0, ts, to, local, 0, fs, fo)
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
	n := len(group)
	switch st.Kind {
	case placement.AllReduce:
		return local, c, c.AllReduce(ctx, local, st.Op)
	case placement.AllGather:
		counts := make([]int, n)
		boxes := make([]box, n)
		for j, r := range group {
			s, o := st.From.Local(r)
			boxes[j] = box{s, o}
			counts[j] = prod(s)
		}
		out, err := x.get("out", dt, prod(ts))
		if err != nil {
			return nil, c, err
		}
		if contiguous(boxes, ts, to) {
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
		for j := range boxes {
			if err := x.box2D(out, 0, ts, to, tmp, off, boxes[j].shape, boxes[j].off); err != nil {
				return nil, c, err
			}
			off += counts[j]
		}
		return out, c, nil
	case placement.ReduceScatter:
		counts := make([]int, n)
		boxes := make([]box, n)
		for j, r := range group {
			s, o := st.To.Local(r)
			boxes[j] = box{s, o}
			counts[j] = prod(s)
		}
		out, err := x.get("out", dt, prod(ts))
		if err != nil {
			return nil, c, err
		}
		in := local
		if !contiguous(boxes, fs, fo) {
			if in, err = x.get("packed", dt, sum(counts)); err != nil {
				return nil, c, err
			}
			off := 0
			for j := range boxes {
				if err := x.box2D(in, off, boxes[j].shape, boxes[j].off, local, 0, fs, fo); err != nil {
					return nil, c, err
				}
				off += counts[j]
			}
		}
		return out, c, c.ReduceScatter(ctx, in, out, counts, st.Op)
	case placement.AllToAll:
		sendCounts := make([]int, n)
		recvCounts := make([]int, n)
		sendBoxes := make([]box, n)
		recvBoxes := make([]box, n)
		for j, r := range group {
			s, o := st.To.Local(r)
			sendBoxes[j] = intersect(box{fs, fo}, box{s, o})
			sendCounts[j] = prod(sendBoxes[j].shape)
			s, o = st.From.Local(r)
			recvBoxes[j] = intersect(box{s, o}, box{ts, to})
			recvCounts[j] = prod(recvBoxes[j].shape)
		}
		send, err := x.get("send", dt, sum(sendCounts))
		if err != nil {
			return nil, c, err
		}
		off := 0
		for j := range sendBoxes {
			if err := x.box2D(send, off, sendBoxes[j].shape, sendBoxes[j].off, local, 0, fs, fo); err != nil {
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
		out, err := x.get("out", dt, prod(ts))
		if err != nil {
			return nil, c, err
		}
		off = 0
		for j := range recvBoxes {
			if err := x.box2D(out, 0, ts, to, recv, off, recvBoxes[j].shape, recvBoxes[j].off); err != nil {
				return nil, c, err
			}
			off += recvCounts[j]
		}
		return out, c, nil
	}
	return nil, c, fmt.Errorf("%w: step kind %v", ErrInvalid, st.Kind)
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// box is a dense block of a tensor: its shape and global offset.
type box struct{ shape, off []int }

func intersect(a, b box) box {
	r := box{make([]int, len(a.shape)), make([]int, len(a.shape))}
	for d := range a.shape {
		lo, hi := max(a.off[d], b.off[d]), min(a.off[d]+a.shape[d], b.off[d]+b.shape[d])
		if hi < lo {
			hi = lo
		}
		r.off[d], r.shape[d] = lo, hi-lo
	}
	return r
}

// contiguous reports whether boxes, in order, are consecutive flat ranges that
// exactly tile the big box (so a collective can use the buffer as is).
func contiguous(boxes []box, shape, off []int) bool {
	pos := 0
	for _, b := range boxes {
		n := prod(b.shape)
		if n == 0 {
			continue
		}
		// Contiguous iff, past the first dim where the box is narrower than the
		// big box, every dim is full, and every dim before it has extent 1.
		d := 0
		for d < len(shape) && b.shape[d] == shape[d] {
			d++
		}
		// dims before d are full; for contiguity they must be 1 unless d is past
		// the end (the box is the whole big box).
		if d < len(shape) {
			for i := 0; i < d; i++ {
				if shape[i] != 1 {
					return false
				}
			}
			for i := d + 1; i < len(shape); i++ {
				if b.shape[i] != shape[i] {
					return false
				}
			}
		}
		start := 0
		for i := range shape {
			start = start*shape[i] + (b.off[i] - off[i])
		}
		if start != pos {
			return false
		}
		pos += n
	}
	return pos == prod(shape)
}

// copyBox walks the intersection of the src box (dense, shape ss at global
// offset so) and the dst box (dense, ds at do) and calls copy2D for each 2-D
// block of it: rows runs of run elements, starting at element di of dst and si
// of src, pitchD and pitchS elements apart (the last two dims).
func copyBox(ds, do, ss, so []int, copy2D func(di, si, pitchD, pitchS, run, rows int) error) error {
	nd := len(ds)
	if nd == 0 {
		return copy2D(0, 0, 1, 1, 1, 1)
	}
	lo := make([]int, nd)
	hi := make([]int, nd)
	for d := 0; d < nd; d++ {
		lo[d], hi[d] = max(do[d], so[d]), min(do[d]+ds[d], so[d]+ss[d])
		if hi[d] <= lo[d] {
			return nil
		}
	}
	run := hi[nd-1] - lo[nd-1]
	rows, pitchD, pitchS := 1, ds[nd-1], ss[nd-1]
	outer := nd - 1 // dims before the 2-D block
	if nd >= 2 {
		rows = hi[nd-2] - lo[nd-2]
		outer = nd - 2
	}
	idx := append([]int(nil), lo...)
	for {
		si, di := 0, 0
		for d := 0; d < nd; d++ {
			si = si*ss[d] + idx[d] - so[d]
			di = di*ds[d] + idx[d] - do[d]
		}
		if err := copy2D(di, si, pitchD, pitchS, run, rows); err != nil {
			return err
		}
		d := outer - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < hi[d] {
				break
			}
			idx[d] = lo[d]
		}
		if d < 0 {
			return nil
		}
	}
}
