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
