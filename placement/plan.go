package placement

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
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
	var c int64
	for r := 0; r < st.From.Mesh.Size(); r++ {
		k, p, next := st.From.Mesh.ring(r, st.MeshDims)
		c = satAdd(c, st.sendElems(r, k, p, next))
	}
	return c
}

// PlanCost sums the cost of steps, saturating at math.MaxInt64.
func PlanCost(steps []Step) int64 {
	var c int64
	for _, s := range steps {
		c = satAdd(c, s.Cost())
	}
	return c
}

// Plan returns the cheapest sequence of steps that turns a tensor laid out as
// from into one laid out as to: the fewest elements sent in total, then the
// fewest steps, then the first in a fixed order. It searches every order
// (Dijkstra over the placements of all mesh dims), so on N-D meshes it uses
// all-to-all rather than a gather where that is cheaper, and flattened groups
// where one collective over several mesh dims beats several. A mesh dim that goes
// from Shard to Partial is an error (ErrNoPath). The search does at most
// DefaultBudget units of work (ErrBudget beyond).
func Plan(from, to Spec) ([]Step, error) { return PlanContext(context.Background(), from, to) }

// PlanContext is Plan within ctx: it stops with ctx's error once ctx is done,
// and draws its work from ctx's Budget (WithBudget; a fresh DefaultBudget when
// ctx carries none), stopping with an error wrapping ErrBudget when it runs out.
func PlanContext(ctx context.Context, from, to Spec) ([]Step, error) {
	if err := from.Validate(); err != nil {
		return nil, err
	}
	if err := to.Validate(); err != nil {
		return nil, err
	}
	if !from.Mesh.Equal(to.Mesh) || !slices.Equal(from.Shape, to.Shape) {
		return nil, fmt.Errorf("placement: plan %s on %s -> %s on %s: shape or mesh differs: %w",
			from, from.Mesh, to, to.Mesh, ErrInvalid)
	}
	for i := range from.Placements {
		_, fs := from.Placements[i].(Shard)
		_, tp := to.Placements[i].(Partial)
		if fs && tp {
			return nil, fmt.Errorf("placement: plan %s -> %s: mesh dim %s goes from %s to %s (S -> P): %w",
				from, to, from.Mesh.DimName(i), from.Placements[i], to.Placements[i], ErrNoPath)
		}
	}
	b, ctx := BudgetOf(ctx)
	key := from.Mesh.String() + " " + from.String() + ">" + FormatList(to.Placements)
	if p, ok := b.recall(key); ok {
		return p.steps, p.err
	}
	steps, err := search(ctx, b, from, to)
	if err != nil && !errors.Is(err, ErrNoPath) {
		return nil, fmt.Errorf("placement: plan %s -> %s on %s: %w", from, to, from.Mesh, err)
	}
	b.remember(key, planned{steps, err})
	return steps, err
}

// stepWork is the work of building and checking one candidate step, besides
// pricing it (which visits every rank).
const stepWork = 64

// node is a layout the search reached: its placements, the cheapest way
// found to it, and the step that way ends with (without its specs, which
// path rebuilds: nodes are many).
type node struct {
	ps    []Placement
	cost  int64
	steps int
	prev  *node // the node this one was reached from, nil for the start
	done  bool
	// The step from prev.
	kind       StepKind
	dims       []int
	dim, toDim int
	op         ReduceOp
}

func (n *node) set(prev *node, st Step, cost int64, steps int) {
	n.prev, n.cost, n.steps = prev, cost, steps
	n.kind, n.dims, n.dim, n.toDim, n.op = st.Kind, st.MeshDims, st.Dim, st.ToDim, st.Op
	if len(st.MeshDims) > 1 {
		n.dims = slices.Clone(st.MeshDims) // flattened's buffer
	}
}

// meshDims holds every mesh dim index, for one-dim steps to share.
var meshDims = func() (a [MaxMeshDims]int) {
	for i := range a {
		a[i] = i
	}
	return a
}()

// meshDim is the MeshDims of a step over mesh dim i alone (shared: never
// modified).
func meshDim(i int) []int { return meshDims[i : i+1 : i+1] }

func (n *node) path(s Spec) []Step {
	out := make([]Step, n.steps)
	for m := n; m.prev != nil; m = m.prev {
		out[m.steps-1] = Step{Kind: m.kind, MeshDims: m.dims, Dim: m.dim, ToDim: m.toDim, Op: m.op,
			From: Spec{Shape: s.Shape, Mesh: s.Mesh, Placements: m.prev.ps},
			To:   Spec{Shape: s.Shape, Mesh: s.Mesh, Placements: m.ps}}
	}
	return out
}

// search is Dijkstra over layouts. Ties (equal cost and steps) keep the path
// found first; nodes are expanded in a fixed order (cost, steps, layout string),
// so the result is deterministic.
func search(ctx context.Context, b *Budget, from, to Spec) ([]Step, error) {
	target := FormatList(to.Placements)
	nodes := map[string]*node{FormatList(from.Placements): {ps: from.Placements}}
	size := int64(from.Mesh.Size())
	var key []byte
	for {
		if err := b.Spend(ctx, int64(len(nodes))); err != nil {
			return nil, err
		}
		var cur *node
		var curKey string
		for k, n := range nodes {
			if n.done {
				continue
			}
			if cur == nil || n.cost < cur.cost || (n.cost == cur.cost && (n.steps < cur.steps ||
				(n.steps == cur.steps && k < curKey))) {
				cur, curKey = n, k
			}
		}
		if cur == nil {
			return nil, fmt.Errorf("placement: plan %s -> %s on %s: %w", from, to, from.Mesh, ErrNoPath)
		}
		if curKey == target {
			return cur.path(from), nil
		}
		cur.done = true
		spec := Spec{Shape: from.Shape, Mesh: from.Mesh, Placements: cur.ps}
		err := moves(spec, from, to, func(st Step) error {
			w := int64(stepWork)
			if st.Moves() {
				w += size
			}
			if err := b.Spend(ctx, w); err != nil {
				return err
			}
			key = appendList(key[:0], st.To.Placements)
			n, ok := nodes[string(key)]
			if ok && n.done {
				return nil
			}
			cost, steps := satAdd(cur.cost, st.Cost()), cur.steps+1
			if !ok {
				n = &node{ps: slices.Clone(st.To.Placements)}
				n.set(cur, st, cost, steps)
				nodes[string(key)] = n
				return nil
			}
			if cost < n.cost || (cost == n.cost && steps < n.steps) {
				n.set(cur, st, cost, steps)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
}

// moves calls visit, in a fixed order, with every single step out of s that
// keeps the spec valid, until visit returns an error, which it returns. Shard
// candidates are the tensor dims with the splits found in from and to (balanced
// always); partial candidates use s's own op (to reduce it) or to's op (to make one).
//
// The steps' To placements and flattened MeshDims live in buffers the next
// step reuses: visit copies what it keeps.
func moves(s, from, to Spec, visit func(Step) error) error {
	var shards []Shard
	seen := map[Shard]bool{}
	addShard := func(sh Shard) {
		if !seen[sh] {
			seen[sh] = true
			shards = append(shards, sh)
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
			for _, sh := range shards {
				if sh == p || !last(s.Placements, i, sh.Dim) {
					continue
				}
				next := scratch()
				next[i] = sh
				add(AllToAll, meshDim(i), next, p.Dim, sh.Dim, 0)
			}
		case Replicate:
			for _, sh := range shards {
				if !last(s.Placements, i, sh.Dim) {
					continue
				}
				next := scratch()
				next[i] = sh
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
			for _, sh := range shards {
				if !last(s.Placements, i, sh.Dim) {
					continue
				}
				next := scratch()
				next[i] = sh
				add(ReduceScatter, meshDim(i), next, sh.Dim, 0, p.Op)
			}
		}
	}
	flattened(s, shards, scratch, add)
	return err
}

// flattened adds the steps over several mesh dims at once: one all-reduce over
// any set of partial dims, one all-gather of the innermost sharders of a tensor
// dim, one reduce-scatter of several partial dims onto one tensor dim.
func flattened(s Spec, shards []Shard, scratch func() []Placement, add func(StepKind, []int, []Placement, int, int, ReduceOp)) {
	n := len(s.Placements)
	if n < 2 {
		return
	}
	op, _ := s.PartialOp()
	buf := make([]int, 0, n)
	for mask := 1; mask < 1<<n; mask++ {
		if bits.OnesCount(uint(mask)) < 2 {
			continue
		}
		dims := buf[:0]
		for i := 0; i < n; i++ {
			if mask&(1<<i) != 0 {
				dims = append(dims, i)
			}
		}
		allP, sameShard := true, true
		first, firstIsShard := s.Placements[dims[0]].(Shard)
		for _, i := range dims {
			if _, ok := s.Placements[i].(Partial); !ok {
				allP = false
			}
			if sh, ok := s.Placements[i].(Shard); !ok || sh != first {
				sameShard = false
			}
		}
		if allP {
			next := scratch()
			for _, i := range dims {
				next[i] = Replicate{}
			}
			add(AllReduce, dims, next, 0, 0, op)
			for _, sh := range shards {
				if !innermostAfter(s.Placements, dims, sh.Dim) {
					continue
				}
				next := scratch()
				for _, i := range dims {
					next[i] = sh
				}
				add(ReduceScatter, dims, next, sh.Dim, 0, op)
			}
		}
		if firstIsShard && sameShard && innermostAfter(s.Placements, dims, first.Dim) {
			// The dims must be the innermost sharders of the tensor dim, with no
			// other sharder of it between them.
			sh := s.Sharders(first.Dim)
			if slices.Equal(sh[len(sh)-len(dims):], dims) {
				next := scratch()
				for _, i := range dims {
					next[i] = Replicate{}
				}
				add(AllGather, dims, next, first.Dim, 0, 0)
			}
		}
	}
}

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
