package placement

import (
	"fmt"
	"math"
	"strings"
)

// StepKind is what one redistribution step does.
type StepKind uint8

const (
	// AllGather: S(d) -> R along the step's mesh dims.
	AllGather StepKind = iota
	// ReduceScatter: P -> S(d).
	ReduceScatter
	// AllReduce: P -> R.
	AllReduce
	// AllToAll: S(d) -> S(e); each rank keeps what it already holds of its new shard.
	AllToAll
	// LocalSlice: R -> S(d); no bytes move.
	LocalSlice
	// OwnerPartial: R -> P. For a sum, the rank at coordinate 0 of the mesh dim
	// keeps the value and the others hold zeros (exact). For avg, max and min every
	// rank keeps its copy, which already reduces to the value. No bytes move.
	OwnerPartial
)

var stepNames = [...]string{
	AllGather: "all_gather", ReduceScatter: "reduce_scatter", AllReduce: "all_reduce",
	AllToAll: "all_to_all", LocalSlice: "local_slice", OwnerPartial: "owner_partial",
}

func (k StepKind) String() string {
	if int(k) < len(stepNames) {
		return stepNames[k]
	}
	return fmt.Sprintf("step(%d)", int(k))
}

// Moves reports whether steps of this kind send bytes between ranks (over
// groups of more than one rank).
func (k StepKind) Moves() bool { return k <= AllToAll }

// Step is one collective (or local op) of a redistribution. The ranks taking part
// form the groups along MeshDims (several dims: one flattened group, nested in the
// order given). From and To are the tensor's whole spec before and after.
type Step struct {
	Kind     StepKind
	MeshDims []int
	// Dim is the tensor dim gathered (AllGather), scattered (ReduceScatter), sliced
	// (LocalSlice), or sharded before an AllToAll.
	Dim int
	// ToDim is the tensor dim sharded after an AllToAll.
	ToDim int
	// Op is the reduction of AllReduce and ReduceScatter, the new partial op of
	// OwnerPartial.
	Op       ReduceOp
	From, To Spec
}

// String reads like "all_gather(S(0)->R) on mesh dim tp".
func (st Step) String() string {
	dims := make([]string, len(st.MeshDims))
	for i, d := range st.MeshDims {
		dims[i] = st.From.Mesh.DimName(d)
	}
	var from, to []string
	for _, d := range st.MeshDims {
		from = append(from, st.From.Placements[d].String())
		to = append(to, st.To.Placements[d].String())
	}
	return fmt.Sprintf("%s(%s->%s) on %s", st.Kind, strings.Join(from, ","), strings.Join(to, ","), strings.Join(dims, "+"))
}

// GroupSize is the number of ranks in each of the step's groups.
func (st Step) GroupSize() int {
	n := 1
	for _, d := range st.MeshDims {
		n *= st.From.Mesh.Dim(d)
	}
	return n
}

// Moves reports whether the step sends bytes: a collective over groups of more
// than one rank. A step over a mesh dim of size 1 only relabels the layout.
func (st Step) Moves() bool { return st.Kind.Moves() && st.GroupSize() > 1 }

// InputElems is the number of elements rank passes into the step (its local
// shard before the step).
func (st Step) InputElems(rank int) int64 { return st.From.LocalElems(rank) }

// SendElems is the number of elements rank sends during the step under the ring
// algorithms (all-gather: every chunk but the next rank's; reduce-scatter: every
// chunk but its own; all-reduce: both; all-to-all: all it does not keep).
func (st Step) SendElems(rank int) int64 {
	if !st.Moves() {
		return 0
	}
	k, p, next := st.From.Mesh.ring(rank, st.MeshDims)
	return st.sendElems(rank, k, p, next)
}

// sendElems is SendElems of rank, at position k of its group of p ranks,
// whose next rank in the ring is next.
func (st Step) sendElems(rank, k, p, next int) int64 {
	switch st.Kind {
	case AllGather:
		return st.To.localElems(rank) - st.From.localElems(next)
	case ReduceScatter:
		return st.From.localElems(rank) - st.To.localElems(rank)
	case AllReduce:
		// Ring reduce-scatter then all-gather over balanced pieces of the buffer.
		n := st.From.localElems(rank)
		_, own := ShardRange(int(n), p, k, Balanced)
		_, nxt := ShardRange(int(n), p, (k+1)%p, Balanced)
		return 2*n - int64(own) - int64(nxt)
	case AllToAll:
		return st.From.localElems(rank) - overlap(st.From, st.To, rank)
	}
	return 0
}

// overlap counts the elements rank holds both before and after.
func overlap(a, b Spec, rank int) int64 {
	var buf [4][MaxTensorDims]int
	nd := len(a.Shape)
	as, ao, bs, bo := buf[0][:0], buf[1][:0], buf[2][:0], buf[3][:0]
	if nd > len(buf[0]) {
		as, ao, bs, bo = nil, nil, nil, nil
	}
	as, ao = a.localInto(rank, as, ao)
	bs, bo = b.localInto(rank, bs, bo)
	n := int64(1)
	for d := range as {
		lo, hi := max(ao[d], bo[d]), min(ao[d]+as[d], bo[d]+bs[d])
		if hi <= lo {
			return 0
		}
		n *= int64(hi - lo)
	}
	return n
}

// Cost is the number of elements sent by all ranks of the mesh together: the sum
// of SendElems over every rank. It saturates at math.MaxInt64.
func (st Step) Cost() int64 {
	if !st.Moves() {
		return 0
	}
	if st.From.uniform() && st.To.uniform() {
		if st.Kind == AllToAll {
			return st.allToAllCost()
		}
		// Every rank holds as many elements before and as many after, so
		// every group of the step sends the same: price one group.
		var c int64
		p := st.GroupSize()
		for k := 0; k < p; k++ {
			c += st.sendElems(0, k, p, 0)
		}
		if t, ok := MulSize(c, int64(st.From.Mesh.Size()/p)); ok {
			return t
		}
		return math.MaxInt64
	}
	var c int64
	for r := 0; r < st.From.Mesh.Size(); r++ {
		k, p, next := st.From.Mesh.ring(r, st.MeshDims)
		c = SatAdd(c, st.sendElems(r, k, p, next))
	}
	return c
}

// allToAllCost is Cost of an all-to-all between uniform layouts. Each rank
// sends its shard less what it keeps, the overlap of its shards before and
// after; along every tensor dim but the two the step moves between, the
// shards before and after coincide and have one length on every rank, so the
// overlap depends only on the coordinates of the mesh dims that shard those
// two: sum it over their combinations and scale by the ranks that share each.
func (st Step) allToAllCost() int64 {
	m := st.From.Mesh
	var buf, cbuf [MaxMeshDims]int
	rel, coords := buf[:0], cbuf[:m.NDim()]
	combos := 1
	for i := range m.NDim() {
		if st.movesDim(st.From.Placements[i]) || st.movesDim(st.To.Placements[i]) {
			rel = append(rel, i)
			combos *= m.Dim(i)
		}
	}
	var kept int64
	for c := 0; c < combos; c++ {
		for j, rem := len(rel)-1, c; j >= 0; j-- {
			coords[rel[j]] = rem % m.Dim(rel[j])
			rem /= m.Dim(rel[j])
		}
		kept += overlap(st.From, st.To, m.Rank(coords))
	}
	n := int64(m.Size())
	local, ok := MulSize(st.From.localElems(0), n)
	if !ok {
		return math.MaxInt64
	}
	return local - kept*(n/int64(combos))
}

// movesDim reports whether p shards one of the tensor dims an all-to-all
// moves between.
func (st Step) movesDim(p Placement) bool {
	sh, ok := p.(Shard)
	return ok && (sh.Dim == st.Dim || sh.Dim == st.ToDim)
}

// PlanCost sums the cost of steps, saturating at math.MaxInt64.
func PlanCost(steps []Step) int64 {
	var c int64
	for _, s := range steps {
		c = SatAdd(c, s.Cost())
	}
	return c
}
