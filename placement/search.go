package placement

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"slices"
)

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
func (s *search) run(ctx context.Context, pl *Planner, limit Picos) ([]Step, error) {
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
		if err := pl.Spend(ctx, expandWork); err != nil {
			return nil, err
		}
		spec := Spec{Shape: from.Shape, Mesh: from.Mesh, Placements: cur.ps}
		err := moves(spec, from, s.to, func(st Step) error {
			if err := pl.Spend(ctx, stepWork); err != nil {
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
	return nil, fmt.Errorf("%w: plan %s -> %s on %s", ErrNoPath, from, s.to, from.Mesh)
}

// MaxExpanded bounds the layouts one search expands. Beyond it (layouts with
// many mesh dims sharding one tensor dim in an order the target reverses,
// on meshes of 5 or 6 dims) the search stops and returns the canonical plan.
const MaxExpanded = 2048
