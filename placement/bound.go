package placement

import (
	"math"
	"math/bits"
)

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
	var t boundTerms
	if !t.needs(m, sizes, ps, target) {
		return 0
	}
	s := m.Gamma + t.lat + t.bytes(total, ndim, ps, target)*float64(m.ElemBytes)/m.Beta
	return Picos(math.Floor(s * 1e12 * (1 - 1e-9)))
}

// dimNeed is the least a mesh dim must do on the way to the target, as bound
// prices it.
type dimNeed uint8

const (
	needNone      dimNeed = iota
	needGather            // all-gather (or reduce-scatter): dim k unsharded in the buffer
	needReduce            // all-reduce: twice that
	needToAll             // all-to-all: dim k sharded in the buffer
	needToAllSame         // all-to-all between two splits of one tensor dim
	needAside             // step aside and back: min(two all-to-alls, one all-gather)
)

// boundTerms is what bound learns of each mesh dim before it prices bytes:
// kept in arrays, so that bounding a layout allocates nothing.
type boundTerms struct {
	n       int // mesh dims
	need    [MaxMeshDims]dimNeed
	size    [MaxMeshDims]float64
	lat     float64 // the latency terms, summed
	shards  uint    // mask: the mesh dims that shard the buffers (now or in the target)
	detours uint    // mask: the detour candidates
}

// needs fills in t for layout ps and reports whether any mesh dim needs a
// collective (otherwise the bound is 0).
func (t *boundTerms) needs(m Model, sizes []int, ps, target []Placement) bool {
	t.n = len(ps)
	// first[d] is the outermost mesh dim whose sharding of tensor dim d
	// changes: the later sharders of d must step aside around it.
	var first [MaxTensorDims]int8
	for d := range first {
		first[d] = MaxMeshDims
	}
	for i, p := range ps {
		tp := target[i]
		if p == tp {
			continue
		}
		if sh, ok := p.(Shard); ok && sh.Dim < MaxTensorDims {
			first[sh.Dim] = min(first[sh.Dim], int8(i))
		}
		if sh, ok := tp.(Shard); ok && sh.Dim < MaxTensorDims {
			first[sh.Dim] = min(first[sh.Dim], int8(i))
		}
	}
	calls := false
	for i, p := range ps {
		tp := target[i]
		t.size[i] = float64(sizes[i])
		_, pS := p.(Shard)
		_, tS := tp.(Shard)
		_, pP := p.(Partial)
		if pS || tS {
			t.shards |= 1 << i
		} else if sizes[i] > 1 {
			t.detours |= 1 << i
		}
		if t.size[i] == 1 {
			continue
		}
		q := t.size[i]
		switch {
		case p == tp:
			if sh, ok := p.(Shard); ok && sh.Dim < MaxTensorDims && int(first[sh.Dim]) < i {
				t.need[i], t.lat = needAside, t.lat+(q-1)*m.Alpha // an all-gather; a slice is free
			}
		case pS && tS && p.(Shard).Dim == tp.(Shard).Dim:
			t.need[i], t.lat = needToAllSame, t.lat+(q-1)*m.Alpha
		case pS && tS:
			t.need[i], t.lat = needToAll, t.lat+(q-1)*m.Alpha
		case pS, pP && tS:
			t.need[i], t.lat = needGather, t.lat+(q-1)*m.Alpha
		case pP:
			t.need[i], t.lat = needReduce, t.lat+2*(q-1)*m.Alpha
		}
		if t.need[i] != needNone {
			calls = true
		}
	}
	return calls
}

// toAllBuf bounds the buffer of an all-to-all on mesh dim i from one tensor
// dim to another, with the dims of sh sharding: for a 2-D tensor, no later
// mesh dim may shard either tensor dim then (i must be their innermost
// sharder), so none of them shards the buffer.
func (t *boundTerms) toAllBuf(total float64, ndim, i int, sh uint) float64 {
	b := total
	for j := 0; j < t.n; j++ {
		if sh&(1<<j) != 0 && (j <= i || ndim > 2) {
			b /= t.size[j]
		}
	}
	return b
}

// bytes is the bound on the elements a rank sends: the least over every set
// of detours (subsets of t.detours) of the larger of two bounds, per-dim
// terms and growth (detourBytes).
func (t *boundTerms) bytes(total float64, ndim int, ps, target []Placement) float64 {
	// Growth: all-gathers pay at least what the buffer grows by, net (a
	// reduce-scatter or a local slice shrinks it again); besides them, the
	// reduce-scatters, all-to-alls and all-reduces, and the shrink after each
	// all-gather undone (a detour's, a step aside's), are paid separately.
	g := growth{cur: total, end: total}
	for i := 0; i < t.n; i++ {
		if _, ok := ps[i].(Shard); ok {
			g.cur /= t.size[i]
		}
		if _, ok := target[i].(Shard); ok {
			g.end /= t.size[i]
		}
	}
	g.net = max(0, g.end-g.cur)
	best := math.Inf(1)
	// Beyond maxDetours candidates, the smallest dims are counted as shrinking
	// every buffer for free: a weaker bound, as cheap to compute.
	const maxDetours = 4
	detours := t.detours
	var free uint
	for bits.OnesCount(detours) > maxDetours {
		small := -1
		for i := 0; i < t.n; i++ {
			if detours&(1<<i) != 0 && (small < 0 || t.size[i] < t.size[small]) {
				small = i
			}
		}
		detours &^= 1 << small
		free |= 1 << small
	}
	for d := detours; ; d = (d - 1) & detours {
		best = min(best, t.detourBytes(total, ndim, ps, g, d, t.shards|d|free))
		if d == 0 {
			break
		}
	}
	return best
}

// growth is the buffer a rank holds now (cur) and in the target (end), and
// its net growth between them.
type growth struct{ cur, end, net float64 }

// detourBytes bounds the elements a rank sends on a plan that takes the
// detours d, with the mesh dims of sh sharding the buffers: the larger of the
// per-dim terms (a) and the growth bound (b).
func (t *boundTerms) detourBytes(total float64, ndim int, ps []Placement, g growth, d, sh uint) float64 {
	prod := 1.0
	for i := 0; i < t.n; i++ {
		if sh&(1<<i) != 0 {
			prod *= t.size[i]
		}
	}
	// The reduce-scatters together (b): whatever their order, they shrink
	// a buffer no smaller than the tensor over every other dim that can
	// shard it by their sizes' product, and pay for it.
	scatter, before := 1.0, total/prod
	var a, b, halves float64
	for i := 0; i < t.n; i++ {
		q := t.size[i]
		// The buffer with dim i unsharded and every dim of sh sharded.
		buf := total / prod
		if sh&(1<<i) != 0 {
			buf *= q
		}
		detour := d&(1<<i) != 0
		partial := isPartial(ps[i])
		if partial && (t.need[i] == needGather || detour) {
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
		case t.need[i] == needGather:
			a += (q - 1) / q * buf
		case t.need[i] == needReduce:
			a += 2 * (q - 1) / q * buf
			b += 2 * (q - 1) / q * buf
		case t.need[i] == needToAll: // or an all-gather and a slice
			a += (q - 1) / q * min(t.toAllBuf(total, ndim, i, sh), buf)
			b += (q - 1) / q * min(t.toAllBuf(total, ndim, i, sh), buf)
		case t.need[i] == needToAllSame:
			a += (q - 1) / q * total / prod
			b += (q - 1) / q * total / prod
		case t.need[i] == needAside:
			a += min(2*(q-1)/q*t.toAllBuf(total, ndim, i, sh), (q-1)/q*buf)
			b += min(2*(q-1)/q*t.toAllBuf(total, ndim, i, sh), (q-1)/q*buf)
		}
	}
	// The reduce-scatters shrink the buffer by at least x and pay at least
	// that; the all-gathers pay the net growth plus every shrink, so
	// also at least end-cur+x (end-cur may be negative).
	x := before * (1 - 1/scatter)
	b += max(g.net+x+halves, g.end-g.cur+2*x)
	return max(a, b)
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
