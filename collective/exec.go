package collective

import (
	"context"
	"fmt"

	"github.com/meshrun/meshrun/placement"
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

// Execute runs a redistribution plan on this rank's local shard: the only code
// that turns placement steps into collective calls. local is dense row-major
// with shape steps[0].From.LocalShape(rank); the result has
// steps[len-1].To.LocalShape(rank). local may be overwritten (all-reduce works in
// place). The mesh must hold the whole world; every rank must execute the same
// steps.
//
// Boxes are handled in general: a shard is the box Spec.Local(rank) (shape and
// global offset); data moving between boxes is packed and unpacked along any
// tensor dim, and a contiguous fast path skips the copies when the boxes are
// consecutive slices (sharding along dim 0, or outer dims of extent 1).
func Execute[T Float](ctx context.Context, w *World, steps []placement.Step, local []T) ([]T, []Executed, error) {
	var log []Executed
	rank := w.Rank()
	for i, st := range steps {
		if err := st.From.Mesh.Validate(w.Size()); err != nil {
			return nil, log, fmt.Errorf("%w: step %d: %v", ErrInvalid, i, err)
		}
		if want := st.From.LocalElems(rank); int64(len(local)) != want {
			return nil, log, fmt.Errorf("%w: step %d (%s): rank %d holds %d elements, want %d", ErrInvalid, i, st, rank, len(local), want)
		}
		ex := Executed{Kind: st.Kind, MeshDims: append([]int(nil), st.MeshDims...), InputElems: int64(len(local)), Algorithm: "local"}
		var z T
		ex.Bytes = ex.InputElems * int64(sizeOf(z))
		out, c, err := execStep(ctx, w, st, local)
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

func sizeOf[T Float](z T) int {
	if dtypeOf[T]() == Float32 {
		return 4
	}
	return 8
}

func prod(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func execStep[T Float](ctx context.Context, w *World, st placement.Step, local []T) ([]T, *Communicator, error) {
	if st.GroupSize() == 1 {
		// A group of one: every kind of step leaves the data as it is (the shard
		// of a dim split once is the dim; the owner of a partial is the rank).
		return local, nil, nil
	}
	rank := w.Rank()
	mesh := st.From.Mesh
	fs, fo := st.From.Local(rank)
	ts, to := st.To.Local(rank)
	switch st.Kind {
	case placement.LocalSlice:
		out := make([]T, prod(ts))
		copyBox(out, ts, to, local, fs, fo)
		return out, nil, nil
	case placement.OwnerPartial:
		if st.Op == placement.Sum && mesh.Coords(rank)[st.MeshDims[0]] != 0 {
			clear(local)
		}
		return local, nil, nil
	}
	group := mesh.Group(rank, st.MeshDims...)
	c, err := w.Comm(ctx, group)
	if err != nil {
		return nil, nil, err
	}
	n := len(group)
	switch st.Kind {
	case placement.AllReduce:
		return local, c, AllReduce(ctx, c, local, st.Op)
	case placement.AllGather:
		counts := make([]int, n)
		boxes := make([]box, n)
		for j, r := range group {
			s, o := st.From.Local(r)
			boxes[j] = box{s, o}
			counts[j] = prod(s)
		}
		out := make([]T, prod(ts))
		if contiguous(boxes, ts, to) {
			return out, c, AllGather(ctx, c, local, out, counts)
		}
		tmp := make([]T, sum(counts))
		if err := AllGather(ctx, c, local, tmp, counts); err != nil {
			return nil, c, err
		}
		off := 0
		for j := range boxes {
			copyBox(out, ts, to, tmp[off:off+counts[j]], boxes[j].shape, boxes[j].off)
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
		out := make([]T, prod(ts))
		in := local
		if !contiguous(boxes, fs, fo) {
			in = make([]T, sum(counts))
			off := 0
			for j := range boxes {
				copyBox(in[off:off+counts[j]], boxes[j].shape, boxes[j].off, local, fs, fo)
				off += counts[j]
			}
		}
		return out, c, ReduceScatter(ctx, c, in, out, counts, st.Op)
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
		send := make([]T, sum(sendCounts))
		off := 0
		for j := range sendBoxes {
			copyBox(send[off:off+sendCounts[j]], sendBoxes[j].shape, sendBoxes[j].off, local, fs, fo)
			off += sendCounts[j]
		}
		recv := make([]T, sum(recvCounts))
		if err := AllToAll(ctx, c, send, sendCounts, recv, recvCounts); err != nil {
			return nil, c, err
		}
		out := make([]T, prod(ts))
		off = 0
		for j := range recvBoxes {
			copyBox(out, ts, to, recv[off:off+recvCounts[j]], recvBoxes[j].shape, recvBoxes[j].off)
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

// copyBox copies the intersection of the src box (dense, shape ss at global
// offset so) and the dst box (dense, ds at do) from src to dst, one contiguous
// run along the last dim at a time.
func copyBox[T Float](dst []T, ds, do []int, src []T, ss, so []int) {
	nd := len(ds)
	if nd == 0 {
		if len(dst) > 0 && len(src) > 0 {
			dst[0] = src[0]
		}
		return
	}
	lo := make([]int, nd)
	hi := make([]int, nd)
	for d := 0; d < nd; d++ {
		lo[d], hi[d] = max(do[d], so[d]), min(do[d]+ds[d], so[d]+ss[d])
		if hi[d] <= lo[d] {
			return
		}
	}
	idx := append([]int(nil), lo...)
	run := hi[nd-1] - lo[nd-1]
	for {
		si, di := 0, 0
		for d := 0; d < nd; d++ {
			si = si*ss[d] + idx[d] - so[d]
			di = di*ds[d] + idx[d] - do[d]
		}
		copy(dst[di:di+run], src[si:si+run])
		d := nd - 2
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < hi[d] {
				break
			}
			idx[d] = lo[d]
		}
		if d < 0 {
			return
		}
	}
}
