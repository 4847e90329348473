package placement

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
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

// Plan returns the cheapest sequence of steps that turns a tensor laid out as
// from into one laid out as to under the context's Model (DefaultModel for
// Plan): the least modelled time, then the fewest collectives, then the fewest
// steps, then the first in a fixed order. It is an A* search over layouts
// with an admissible, consistent bound (see bound), so it returns an optimal
// plan among every order of every step moves offers — single-dim
// collectives, all-to-alls, flattened groups over several mesh dims, local
// slices — while expanding only the layouts that could lie on a cheaper
// path. A mesh dim that goes from Shard to Partial is an error (ErrNoPath).
// The search does at most DefaultBudget units of work (ErrBudget beyond).
func Plan(from, to Spec) ([]Step, error) { return PlanContext(context.Background(), from, to) }

// PlanContext is Plan within ctx: priced by ctx's Model (WithModel), it stops
// with ctx's error once ctx is done, and draws its work from ctx's Budget
// (WithBudget; a fresh DefaultBudget when ctx carries none), stopping with an
// error wrapping ErrBudget when it runs out.
func PlanContext(ctx context.Context, from, to Spec) ([]Step, error) {
	steps, _, err := planSearch(ctx, from, to, 1, math.MaxInt64)
	return steps, err
}

// PlanWithin is PlanContext for planners that only need plans cheaper than
// limit (a strategy search that has a cheaper strategy in hand): once every
// plan left takes more than limit, it stops and returns an error for which
// AboveLimit reports a lower bound on the cheapest plan's time. Another call
// under the same Budget with a higher limit resumes the search where this
// one stopped.
func PlanWithin(ctx context.Context, from, to Spec, limit Picos) ([]Step, error) {
	steps, _, err := planSearch(ctx, from, to, 1, limit)
	return steps, err
}

// AboveLimit reports whether err is PlanWithin's error for a plan above its
// limit, and the lower bound it proved on the plan's time.
func AboveLimit(err error) (Picos, bool) {
	var ab *above
	if errors.As(err, &ab) {
		return ab.lb, true
	}
	return 0, false
}

// planSearch plans with the bound weighted by weight: 1 is A*, 0 Dijkstra
// (for tests to compare), more than 1 trades optimality for speed. It also
// returns the number of layouts expanded.
func planSearch(ctx context.Context, from, to Spec, weight float64, limit Picos) ([]Step, int, error) {
	if err := from.Validate(); err != nil {
		return nil, 0, err
	}
	if err := to.Validate(); err != nil {
		return nil, 0, err
	}
	if !from.Mesh.Equal(to.Mesh) || !slices.Equal(from.Shape, to.Shape) {
		return nil, 0, fmt.Errorf("placement: plan %s on %s -> %s on %s: shape or mesh differs: %w",
			from, from.Mesh, to, to.Mesh, ErrInvalid)
	}
	for i := range from.Placements {
		_, fs := from.Placements[i].(Shard)
		_, tp := to.Placements[i].(Partial)
		if fs && tp {
			return nil, 0, fmt.Errorf("placement: plan %s -> %s: mesh dim %s goes from %s to %s (S -> P): %w",
				from, to, from.Mesh.DimName(i), from.Placements[i], to.Placements[i], ErrNoPath)
		}
	}
	m := ModelOf(ctx)
	if err := m.Validate(); err != nil {
		return nil, 0, err
	}
	b, ctx := BudgetOf(ctx)
	key := fmt.Sprintf("%s %s>%s %v %v", from.Mesh, from, FormatList(to.Placements), m, weight)
	p, ok := b.recall(key)
	if ok && p.search == nil {
		return p.steps, p.expanded, p.err
	}
	if !ok {
		p.search = newSearch(m, from, to, weight)
	}
	steps, err := p.search.run(ctx, b, limit)
	var ab *above
	if errors.As(err, &ab) {
		b.remember(key, planned{search: p.search})
		return nil, p.search.expanded, err
	}
	if err != nil && !errors.Is(err, ErrNoPath) {
		return nil, p.search.expanded, fmt.Errorf("placement: plan %s -> %s on %s: %w", from, to, from.Mesh, err)
	}
	b.remember(key, planned{steps: steps, err: err, expanded: p.search.expanded})
	return steps, p.search.expanded, err
}

// stepWork is the work of building, checking and pricing one candidate step
// (about 0.1 µs); expandWork that of taking a layout off the queue.
const (
	stepWork   = 1
	expandWork = 16
)

// cost is what the search minimizes, compared in order.
type cost struct {
	time   Picos
	moving int // steps that send bytes
	steps  int
}

func (c cost) less(o cost) bool {
	switch {
	case c.time != o.time:
		return c.time < o.time
	case c.moving != o.moving:
		return c.moving < o.moving
	}
	return c.steps < o.steps
}

// node is a layout the search reached: its placements, the cheapest way
// found to it, and the step that way ends with (without its specs, which
// path rebuilds: nodes are many).
type node struct {
	ps   []Placement
	key  layoutKey
	g    cost
	h    Picos
	prev *node // the node this one was reached from, nil for the start
	// The step from prev.
	kind       StepKind
	dims       []int
	dim, toDim int
	op         ReduceOp
}

func (n *node) set(prev *node, st Step, g cost) {
	n.prev, n.g = prev, g
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
	var k int
	for m := n; m.prev != nil; m = m.prev {
		k++
	}
	out := make([]Step, k)
	for m := n; m.prev != nil; m = m.prev {
		k--
		out[k] = Step{Kind: m.kind, MeshDims: m.dims, Dim: m.dim, ToDim: m.toDim, Op: m.op,
			From: Spec{Shape: s.Shape, Mesh: s.Mesh, Placements: m.prev.ps},
			To:   Spec{Shape: s.Shape, Mesh: s.Mesh, Placements: m.ps}}
	}
	return out
}

// layoutKey packs a layout, one byte per mesh dim.
type layoutKey uint64

func placementCode(p Placement) uint64 {
	switch p := p.(type) {
	case Partial:
		return 1 + uint64(p.Op)
	case Shard:
		return 8 + 2*uint64(p.Dim) + uint64(p.Split)
	}
	return 0
}

func keyOf(ps []Placement) layoutKey {
	var k uint64
	for i, p := range ps {
		k |= placementCode(p) << (8 * i)
	}
	return layoutKey(k)
}

// bound is a lower bound on the time from layout ps to the target: an
// admissible heuristic for the search (consistent but for rounding, which
// the search tolerates by reopening layouts).
//
// Every mesh dim whose placement must change through a collective (a shard
// to anything else, a partial to anything but itself) needs a step over a
// group that includes it, paying at least (size-1)·alpha of latency (twice to
// turn a partial into a replica), and at least one call (gamma) is made. A
// step over several dims (flattened, group size Q) pays at least the sum of
// its dims' terms, since Q-1 >= the sum of their size-1: the terms add up.
//
// Bytes: a step on mesh dim k of size q sends (q-1)/q of a buffer in which
// dim k is not sharded (an all-gather's output, a reduce-scatter's or an
// all-reduce's input; twice for an all-reduce), and an all-to-all (q-1)/q of
// one in which it is. That buffer is at least the tensor divided by the sizes
// of the other mesh dims that can shard it at that time: those sharded now or
// in the target. A dim replicated now and not sharded in the target could be
// sharded for a while (a local slice, later gathered: a detour that shrinks
// the buffers of the steps in between), and so could a partial one (a
// reduce-scatter, later gathered), so the bound is the least over every set D
// of such detours of the steps' terms with D's dims sharding too, plus an
// all-gather per detour (a partial dim's reduce-scatter and all-gather cost
// what its all-reduce would).
//
// The buffer's growth bounds the bytes too: see below; the larger bound is
// kept.
//
// An all-to-all on mesh dim i must be the innermost sharder of both tensor
// dims it moves between; for a 2-D tensor that leaves no later mesh dim
// sharding the buffer (the other way, an all-gather and a slice, is bounded
// as a gather).
//
// Sharders nest in mesh dim order, and only the innermost sharder of a tensor
// dim may stop or start sharding it. So where mesh dim i must change whether
// (or how) it shards tensor dim d, every later mesh dim sharding d now and in
// the target must step aside and back: two all-to-alls, or an all-gather and
// a local slice, whichever bound is smaller.
func bound(m Model, sizes []int, total float64, ndim int, ps, target []Placement) Picos {
	const (
		none      = iota
		gather    // all-gather (or reduce-scatter): dim k unsharded in the buffer
		reduce    // all-reduce: twice that
		toAll     // all-to-all: dim k sharded in the buffer
		toAllSame // all-to-all between two splits of one tensor dim
		aside     // step aside and back: min(two all-to-alls, one all-gather)
	)
	var need [MaxMeshDims]uint8
	var size [MaxMeshDims]float64
	var first [MaxTensorDims]int8
	for d := range first {
		first[d] = MaxMeshDims
	}
	for i, p := range ps {
		t := target[i]
		if p == t {
			continue
		}
		if sh, ok := p.(Shard); ok && sh.Dim < MaxTensorDims {
			first[sh.Dim] = min(first[sh.Dim], int8(i))
		}
		if sh, ok := t.(Shard); ok && sh.Dim < MaxTensorDims {
			first[sh.Dim] = min(first[sh.Dim], int8(i))
		}
	}
	var lat float64
	calls := false
	var shards, detours uint // masks: dims that shard the buffers, detour candidates
	for i, p := range ps {
		t := target[i]
		size[i] = float64(sizes[i])
		_, pS := p.(Shard)
		_, tS := t.(Shard)
		_, pP := p.(Partial)
		if pS || tS {
			shards |= 1 << i
		} else if sizes[i] > 1 {
			detours |= 1 << i
		}
		if size[i] == 1 {
			continue
		}
		q := size[i]
		switch {
		case p == t:
			if sh, ok := p.(Shard); ok && sh.Dim < MaxTensorDims && int(first[sh.Dim]) < i {
				need[i], lat = aside, lat+(q-1)*m.Alpha // an all-gather; a slice is free
			}
		case pS && tS && p.(Shard).Dim == t.(Shard).Dim:
			need[i], lat = toAllSame, lat+(q-1)*m.Alpha
		case pS && tS:
			need[i], lat = toAll, lat+(q-1)*m.Alpha
		case pS, pP && tS:
			need[i], lat = gather, lat+(q-1)*m.Alpha
		case pP:
			need[i], lat = reduce, lat+2*(q-1)*m.Alpha
		}
		if need[i] != none {
			calls = true
		}
	}
	if !calls {
		return 0
	}
	n := len(ps)
	// toAllBuf bounds the buffer of an all-to-all on mesh dim i from one
	// tensor dim to another, with the dims of sh sharding: for a 2-D tensor,
	// no later mesh dim may shard either tensor dim then (i must be their
	// innermost sharder), so none of them shards the buffer.
	toAllBuf := func(i int, sh uint) float64 {
		b := total
		for j := 0; j < n; j++ {
			if sh&(1<<j) != 0 && (j <= i || ndim > 2) {
				b /= size[j]
			}
		}
		return b
	}
	// Growth: all-gathers pay at least what the buffer grows by, net (a
	// reduce-scatter or a local slice shrinks it again); besides them, the
	// reduce-scatters, all-to-alls and all-reduces, and the shrink after each
	// all-gather undone (a detour's, a step aside's), are paid separately.
	cur, end := total, total
	for i := 0; i < n; i++ {
		if _, ok := ps[i].(Shard); ok {
			cur /= size[i]
		}
		if _, ok := target[i].(Shard); ok {
			end /= size[i]
		}
	}
	growth := max(0, end-cur)
	// The least bytes over every set of detours (subsets of detours): for
	// each, the larger of two bounds, per-dim terms (a) and growth (b).
	best := math.Inf(1)
	// Beyond maxDetours candidates, the smallest dims are counted as shrinking
	// every buffer for free: a weaker bound, as cheap to compute.
	const maxDetours = 4
	var free uint
	for bits.OnesCount(detours) > maxDetours {
		small := -1
		for i := 0; i < n; i++ {
			if detours&(1<<i) != 0 && (small < 0 || size[i] < size[small]) {
				small = i
			}
		}
		detours &^= 1 << small
		free |= 1 << small
	}
	for d := detours; ; d = (d - 1) & detours {
		sh := shards | d | free
		prod := 1.0
		for i := 0; i < n; i++ {
			if sh&(1<<i) != 0 {
				prod *= size[i]
			}
		}
		// The reduce-scatters together (b): whatever their order, they shrink
		// a buffer no smaller than the tensor over every other dim that can
		// shard it by their sizes' product, and pay for it.
		scatter, before := 1.0, total/prod
		var a, b, halves float64
		for i := 0; i < n; i++ {
			q := size[i]
			// The buffer with dim i unsharded and every dim of sh sharded.
			buf := total / prod
			if sh&(1<<i) != 0 {
				buf *= q
			}
			detour := d&(1<<i) != 0
			partial := isPartial(ps[i])
			if partial && (need[i] == gather || detour) {
				scatter *= q
				before *= q
			}
			switch {
			case detour && partial:
				// A partial dim sharded for a while: a reduce-scatter and a
				// later all-gather.
				a += 2 * (q - 1) / q * buf
				halves += (q - 1) / q * buf
			case detour: // a replicated dim's detour: its all-gather
				a += (q - 1) / q * buf
				b += (q - 1) / q * buf
			case need[i] == gather:
				a += (q - 1) / q * buf
			case need[i] == reduce:
				a += 2 * (q - 1) / q * buf
				b += 2 * (q - 1) / q * buf
			case need[i] == toAll: // or an all-gather and a slice
				a += (q - 1) / q * min(toAllBuf(i, sh), buf)
				b += (q - 1) / q * min(toAllBuf(i, sh), buf)
			case need[i] == toAllSame:
				a += (q - 1) / q * total / prod
				b += (q - 1) / q * total / prod
			case need[i] == aside:
				a += min(2*(q-1)/q*toAllBuf(i, sh), (q-1)/q*buf)
				b += min(2*(q-1)/q*toAllBuf(i, sh), (q-1)/q*buf)
			}
		}
		// The reduce-scatters shrink the buffer by at least x and pay at least
		// that; the all-gathers pay the net growth plus every shrink, so
		// also at least end-cur+x (end-cur may be negative).
		x := before * (1 - 1/scatter)
		b += max(growth+x+halves, end-cur+2*x)
		best = min(best, max(a, b))
		if d == 0 {
			break
		}
	}
	s := m.Gamma + lat + best*float64(m.ElemBytes)/m.Beta
	return Picos(math.Floor(s * 1e12 * (1 - 1e-9)))
}

// LowerBound is a lower bound on the modelled time of moving a tensor of
// ndim dims from placements from to placements to over mesh dims of the given
// sizes, when each rank's share of the tensor is at least elems elements
// before those dims divide it: the bound the search is guided by, for
// planners that price many redistributions to rule some out unplanned (mesh
// dims left out of from and to only shrink the tensor; pass elems divided by
// their sizes).
func LowerBound(m Model, elems float64, ndim int, sizes []int, from, to []Placement) Picos {
	if len(from) != len(sizes) || len(to) != len(sizes) || len(sizes) > MaxMeshDims {
		return 0
	}
	return bound(m, sizes, elems, ndim, from, to)
}

// entry is a layout waiting in the search's queue with its priority.
type entry struct {
	f cost // g plus the bound
	n *node
	g cost // the node's g when queued: stale once it improved
}

type queue []entry

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].f != q[j].f {
		return q[i].f.less(q[j].f)
	}
	if q[i].g.time != q[j].g.time {
		return q[i].g.time > q[j].g.time // the deeper first: nearer the target
	}
	return q[i].n.key < q[j].n.key
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(entry)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// search is A* over layouts (with weight 0, Dijkstra), resumable: run stops
// where every layout still queued is priced above its limit, and a later run
// with a higher limit picks up from there. Ties keep the path found first;
// layouts of equal priority leave the queue in key order, so the result is
// deterministic. A node whose cost improves after it was expanded is queued
// again, so the result is optimal even where rounding makes the bound a
// picosecond inconsistent.
type search struct {
	m        Model
	from, to Spec
	target   layoutKey
	nodes    map[layoutKey]*node
	h        func([]Placement) Picos
	q        *queue
	expanded int
	// The canonical plan bounds the search from above: a layout that cannot
	// beat it is not queued, and when the search has expanded MaxExpanded
	// layouts without finishing, the canonical plan is the answer.
	fallback []Step
	ub       cost
}

func newSearch(m Model, from, to Spec, weight float64) *search {
	s := &search{m: m, from: from, to: to, target: keyOf(to.Placements), ub: cost{time: math.MaxInt64}}
	start := &node{ps: from.Placements, key: keyOf(from.Placements)}
	s.nodes = map[layoutKey]*node{start.key: start}
	var total float64 // the tensor's elements
	if weight > 0 {
		n, _ := ShapeElems(from.Shape)
		total = float64(n)
	}
	s.h = func(ps []Placement) Picos {
		if weight == 0 {
			return 0
		}
		return Picos(weight * float64(bound(m, from.Mesh.shape, total, len(from.Shape), ps, to.Placements)))
	}
	start.h = s.h(start.ps)
	s.q = &queue{{f: cost{time: start.h}, n: start}}
	if weight > 0 {
		if s.fallback = canonical(from, to); s.fallback != nil {
			s.ub = cost{time: m.PlanTime(s.fallback), steps: len(s.fallback)}
			for _, st := range s.fallback {
				if st.Moves() {
					s.ub.moving++
				}
			}
		}
	}
	return s
}

// above is the error of a search stopped at its limit: every plan left costs
// more than the limit, at least lb.
type above struct{ lb Picos }

func (e *above) Error() string {
	return fmt.Sprintf("placement: every plan takes more than the limit (at least %s)", e.lb)
}

// run searches on until it finds the cheapest plan, or until every layout
// queued is priced above limit (an *above error).
func (s *search) run(ctx context.Context, b *Budget, limit Picos) ([]Step, error) {
	m, from := s.m, s.from
	for s.q.Len() > 0 {
		if f := (*s.q)[0].f.time; f > limit {
			return nil, &above{lb: f}
		}
		e := heap.Pop(s.q).(entry)
		cur := e.n
		if e.g != cur.g {
			continue // stale
		}
		if cur.key == s.target {
			return cur.path(from), nil
		}
		if s.expanded >= MaxExpanded && s.fallback != nil {
			return s.fallback, nil
		}
		s.expanded++
		if err := b.Spend(ctx, expandWork); err != nil {
			return nil, err
		}
		spec := Spec{Shape: from.Shape, Mesh: from.Mesh, Placements: cur.ps}
		err := moves(spec, from, s.to, func(st Step) error {
			if err := b.Spend(ctx, stepWork); err != nil {
				return err
			}
			k := keyOf(st.To.Placements)
			g := cost{SatPicos(cur.g.time, m.Time(st)), cur.g.moving, cur.g.steps + 1}
			if st.Moves() {
				g.moving++
			}
			n, ok := s.nodes[k]
			if ok && !g.less(n.g) {
				return nil
			}
			if !ok {
				n = &node{ps: slices.Clone(st.To.Placements), key: k}
				n.h = s.h(n.ps)
				s.nodes[k] = n
			}
			n.set(cur, st, g)
			f := g
			f.time = SatPicos(f.time, n.h)
			if s.ub.less(f) {
				return nil // no better than the canonical plan
			}
			heap.Push(s.q, entry{f: f, n: n, g: g})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	if s.fallback != nil {
		return s.fallback, nil // nothing beat it
	}
	return nil, fmt.Errorf("placement: plan %s -> %s on %s: %w", from, s.to, from.Mesh, ErrNoPath)
}

// MaxExpanded bounds the layouts one search expands. Beyond it (layouts with
// many mesh dims sharding one tensor dim in an order the target reverses,
// on meshes of 5 or 6 dims) the search stops and returns the canonical plan.
const MaxExpanded = 2048

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
