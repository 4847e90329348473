package placement

import (
	"math/bits"
	"slices"
)

// canonical is a plan that always works, built without search: gather,
// innermost first, every sharder that changes or sits inside one that does;
// all-reduce the partial dims not turned into shards; then, outermost first,
// reduce-scatter or slice into the target's shards; last, make the target's
// partial dims partial on their owners. It returns nil where no plan exists
// (a shard made partial).
func canonical(from, to Spec) []Step {
	n := len(from.Placements)
	first := make([]int, len(from.Shape))
	for d := range first {
		first[d] = n
	}
	for i := range n {
		p, t := from.Placements[i], to.Placements[i]
		if p == t {
			continue
		}
		if sh, ok := p.(Shard); ok {
			first[sh.Dim] = min(first[sh.Dim], i)
		}
		if sh, ok := t.(Shard); ok {
			first[sh.Dim] = min(first[sh.Dim], i)
		}
	}
	steps := []Step{}
	cur := from
	add := func(kind StepKind, i int, p Placement, dim int, op ReduceOp) {
		next := cur.With(i, p)
		steps = append(steps, Step{Kind: kind, MeshDims: meshDim(i), Dim: dim, Op: op, From: cur, To: next})
		cur = next
	}
	for i := n - 1; i >= 0; i-- {
		if sh, ok := cur.Placements[i].(Shard); ok && (sh != to.Placements[i] || i > first[sh.Dim]) {
			add(AllGather, i, Replicate{}, sh.Dim, 0)
		}
	}
	for i := range n {
		p, ok := cur.Placements[i].(Partial)
		if !ok || p == to.Placements[i] {
			continue
		}
		if _, ok := to.Placements[i].(Shard); !ok {
			add(AllReduce, i, Replicate{}, 0, p.Op)
		}
	}
	for i := range n {
		t, ok := to.Placements[i].(Shard)
		if !ok || cur.Placements[i] == to.Placements[i] {
			continue
		}
		switch p := cur.Placements[i].(type) {
		case Partial:
			add(ReduceScatter, i, t, t.Dim, p.Op)
		case Replicate:
			add(LocalSlice, i, t, t.Dim, 0)
		default:
			return nil
		}
	}
	for i := range n {
		t, ok := to.Placements[i].(Partial)
		if !ok || cur.Placements[i] == to.Placements[i] {
			continue
		}
		if _, ok := cur.Placements[i].(Replicate); !ok {
			return nil
		}
		add(OwnerPartial, i, t, 0, t.Op)
	}
	if !cur.Equal(to) {
		return nil
	}
	return steps
}

// moves calls visit, in a fixed order, with every single step out of s that
// keeps the spec valid, until visit returns an error, which it returns. Shard
// candidates are the tensor dims with the splits found in from and to (balanced
// always); partial candidates use s's own op (to reduce it) or to's op (to make one).
//
// The steps' To placements and flattened MeshDims live in buffers the next
// step reuses: visit copies what it keeps.
func moves(s, from, to Spec, visit func(Step) error) error {
	var shardBuf [2 * MaxTensorDims]Shard
	var valueBuf [2 * MaxTensorDims]Placement
	shards, values := shardBuf[:0], valueBuf[:0] // values: shards as interned Placements
	addShard := func(sh Shard) {
		if !slices.Contains(shards, sh) {
			shards = append(shards, sh)
			values = append(values, shardValue(sh))
		}
	}
	for d := range s.Shape {
		addShard(Shard{Dim: d})
	}
	for _, sp := range []Spec{from, to} {
		for _, p := range sp.Placements {
			if sh, ok := p.(Shard); ok {
				addShard(sh)
			}
		}
	}
	curOp, hasP := s.PartialOp()
	toOp, toHasP := to.PartialOp()

	buf := make([]Placement, len(s.Placements))
	scratch := func() []Placement { return append(buf[:0], s.Placements...) }
	var err error
	add := func(kind StepKind, dims []int, next []Placement, dim, toDim int, op ReduceOp) {
		if err != nil || !validPlacements(len(s.Shape), next) {
			return
		}
		// A mesh dim of one rank only relabels: it steps straight to its
		// target placement, or to R to let another dim change under it.
		for _, i := range dims {
			if s.Mesh.Dim(i) == 1 && next[i] != to.Placements[i] && !isReplicate(next[i]) {
				return
			}
		}
		ns := Spec{Shape: s.Shape, Mesh: s.Mesh, Placements: next}
		err = visit(Step{Kind: kind, MeshDims: dims, Dim: dim, ToDim: toDim, Op: op, From: s, To: ns})
	}
	// last reports whether mesh dim i is the innermost sharder of tensor dim d.
	last := func(ps []Placement, i, d int) bool {
		for j := i + 1; j < len(ps); j++ {
			if sh, ok := ps[j].(Shard); ok && sh.Dim == d {
				return false
			}
		}
		return true
	}
	for i, p := range s.Placements {
		switch p := p.(type) {
		case Shard:
			if !last(s.Placements, i, p.Dim) {
				continue
			}
			next := scratch()
			next[i] = Replicate{}
			add(AllGather, meshDim(i), next, p.Dim, 0, 0)
			for k, sh := range shards {
				if sh == p || !last(s.Placements, i, sh.Dim) {
					continue
				}
				next := scratch()
				next[i] = values[k]
				add(AllToAll, meshDim(i), next, p.Dim, sh.Dim, 0)
			}
		case Replicate:
			for k, sh := range shards {
				if !last(s.Placements, i, sh.Dim) {
					continue
				}
				next := scratch()
				next[i] = values[k]
				add(LocalSlice, meshDim(i), next, sh.Dim, 0, 0)
			}
			if toHasP && (!hasP || curOp == toOp) {
				if _, want := to.Placements[i].(Partial); want {
					next := scratch()
					next[i] = Partial{Op: toOp}
					add(OwnerPartial, meshDim(i), next, 0, 0, toOp)
				}
			}
		case Partial:
			next := scratch()
			next[i] = Replicate{}
			add(AllReduce, meshDim(i), next, 0, 0, p.Op)
			for k, sh := range shards {
				if !last(s.Placements, i, sh.Dim) {
					continue
				}
				next := scratch()
				next[i] = values[k]
				add(ReduceScatter, meshDim(i), next, sh.Dim, 0, p.Op)
			}
		}
	}
	flattened(s, shards, values, scratch, add)
	return err
}

// flattened adds the steps over several mesh dims at once: one all-reduce over
// any set of partial dims, one all-gather of the innermost sharders of a tensor
// dim, one reduce-scatter of several partial dims onto one tensor dim.
func flattened(s Spec, shards []Shard, values []Placement, scratch func() []Placement, add func(StepKind, []int, []Placement, int, int, ReduceOp)) {
	n := len(s.Placements)
	if n < 2 {
		return
	}
	op, _ := s.PartialOp()
	var pbuf, dbuf [MaxMeshDims]int
	partial := pbuf[:0]
	for i, p := range s.Placements {
		if _, ok := p.(Partial); ok {
			partial = append(partial, i)
		}
	}
	// Every set of two or more partial dims.
	for mask := 1; mask < 1<<len(partial); mask++ {
		if bits.OnesCount(uint(mask)) < 2 {
			continue
		}
		dims := dbuf[:0]
		for k, i := range partial {
			if mask&(1<<k) != 0 {
				dims = append(dims, i)
			}
		}
		next := scratch()
		for _, i := range dims {
			next[i] = Replicate{}
		}
		add(AllReduce, dims, next, 0, 0, op)
		for k, sh := range shards {
			if !innermostAfter(s.Placements, dims, sh.Dim) {
				continue
			}
			next := scratch()
			for _, i := range dims {
				next[i] = values[k]
			}
			add(ReduceScatter, dims, next, sh.Dim, 0, op)
		}
	}
	// The innermost two or more sharders of each tensor dim, when they shard
	// it alike.
	for d := range s.Shape {
		sh := s.Sharders(d)
		for k := len(sh) - 2; k >= 0; k-- {
			first := s.Placements[sh[k]].(Shard)
			if s.Placements[sh[len(sh)-1]].(Shard) != first || s.Placements[sh[k+1]].(Shard) != first {
				break
			}
			dims := append(dbuf[:0], sh[k:]...)
			next := scratch()
			for _, i := range dims {
				next[i] = Replicate{}
			}
			add(AllGather, dims, next, d, 0, 0)
		}
	}
}

// shardValues holds every Shard as a Placement, so that steps built by the
// search do not allocate one each time.
var shardValues = func() (v [MaxTensorDims][2]Placement) {
	for d := range v {
		for sp := range v[d] {
			v[d][sp] = Shard{Dim: d, Split: Split(sp)}
		}
	}
	return v
}()

// shardValue is sh as a Placement, interned where it can be.
func shardValue(sh Shard) Placement {
	if sh.Dim >= 0 && sh.Dim < MaxTensorDims && sh.Split <= Chunk {
		return shardValues[sh.Dim][sh.Split]
	}
	return sh
}

func isPartial(p Placement) bool { _, ok := p.(Partial); return ok }

func isReplicate(p Placement) bool { _, ok := p.(Replicate); return ok }

// validPlacements reports, without building an error, whether ps passes the
// placement checks of Spec.Validate for a tensor of ndim dims (the shape and
// the mesh being known valid).
func validPlacements(ndim int, ps []Placement) bool {
	op, hasOp := ReduceOp(0), false
	for _, p := range ps {
		switch p := p.(type) {
		case Shard:
			if p.Dim < 0 || p.Dim >= ndim || p.Split > Chunk {
				return false
			}
		case Partial:
			if p.Op > Min || (hasOp && p.Op != op) {
				return false
			}
			op, hasOp = p.Op, true
		case Replicate:
		default:
			return false
		}
	}
	return true
}

// innermostAfter reports whether no mesh dim after the first of dims, other than
// dims themselves, shards tensor dim d.
func innermostAfter(ps []Placement, dims []int, d int) bool {
	for j := dims[0] + 1; j < len(ps); j++ {
		if slices.Contains(dims, j) {
			continue
		}
		if sh, ok := ps[j].(Shard); ok && sh.Dim == d {
			return false
		}
	}
	return true
}
