package collective

import (
	"encoding/binary"
	"fmt"
)

// The arena algorithms (see ArenaTransport): when every member's buffer of a
// collective lies in its shared-memory arena, each rank reads the peers'
// buffers directly. A collective past the thresholds below, on a transport
// with arenas, first tells every member where its buffer lies (one message
// each way); all take the arena path, or all the usual one.

// arenaMin is the smallest all-reduce, in bytes, that asks for the arenas:
// below, its three rounds of messages cost more than the copies save (2
// ranks, bench/collective with BENCH_TRACE: 18.5 us against the ring's 16-17
// at 64 KiB). The all-gather and the reduce-scatter, with one round fewer,
// ask from arenaGatherMin up: at 64 KiB they took 4.5-4.8 us against the
// ring's 9.2-10.2 over 2 ranks, and 43-66 us against 46-51 over 4.
const (
	arenaMin       = 256 << 10
	arenaGatherMin = 32 << 10
)

// arenaStep numbers the arena algorithms' messages, above any ring step.
const arenaStep = 1 << 30

// arenaBuffers returns each member's buffer (lens[j] bytes; this rank's is
// b) as mapped here when the collective, of size bytes, asks for the arenas
// and every member's buffer lies in its arena; nil when not (the caller
// takes its usual algorithm).
func arenaBuffers(o *opState, size int, allReduce bool, b []byte, lens []int) ([][]byte, error) {
	if arenaOf(o.c.w) == nil {
		return nil, nil
	}
	t := tuningOf(o.c.w.t.Name())
	threshold := t.arenaGather
	if allReduce {
		threshold = t.arena
	}
	if size < threshold {
		return nil, nil
	}
	return arenaPeers(o, b, lens)
}

func arenaPeers(o *opState, b []byte, lens []int) ([][]byte, error) {
	c := o.c
	at := c.w.t.(ArenaTransport)
	n, k := len(c.ranks), c.me
	msg := make([]byte, 8*(n+1))
	mine := int64(-1)
	if off, ok := at.Arena().Offset(b); ok && len(b) == lens[k] {
		mine = int64(off)
	}
	binary.LittleEndian.PutUint64(msg, uint64(mine))
	for i := 1; i < n; i++ {
		o.send((k+i)%n, arenaStep, 0, 0, msg[:8])
	}
	offs := make([]int64, n)
	offs[k] = mine
	for i := 1; i < n; i++ {
		p := (k - i + n) % n
		slot := msg[8*(1+p) : 8*(2+p)]
		if err := o.recv(p, arenaStep, 0, 0, slot); err != nil {
			return nil, err
		}
		offs[p] = int64(binary.LittleEndian.Uint64(slot))
	}
	if err := o.drain(); err != nil {
		return nil, err
	}
	for _, off := range offs {
		if off < 0 {
			return nil, nil
		}
	}
	o.release = at.ReadArenas()
	bufs := make([][]byte, n)
	for j := range bufs {
		if j == k {
			bufs[j] = b
			continue
		}
		pa := at.PeerArena(c.ranks[j])
		if pa == nil || offs[j] > int64(len(pa)-lens[j]) {
			return nil, &Error{Kind: ErrCorrupt, Rank: c.ranks[j], Reporter: c.w.rank,
				Detail: fmt.Sprintf("arena buffer of %d bytes at offset %d outside its arena of %d", lens[j], offs[j], len(pa))}
		}
		bufs[j] = pa[offs[j] : offs[j]+int64(lens[j])]
	}
	return bufs, nil
}

// arenaSync returns once every member has reached the same step: after it,
// no member reads what it read before.
func arenaSync(o *opState, step uint32) error {
	n, k := len(o.c.ranks), o.c.me
	for i := 1; i < n; i++ {
		o.send((k+i)%n, arenaStep+step, 0, 0, nil)
	}
	for i := 1; i < n; i++ {
		if err := o.recv((k-i+n)%n, arenaStep+step, 0, 0, nil); err != nil {
			return err
		}
	}
	return nil
}

// allGatherArena copies each peer's input, read in its arena, into out; the
// last sync keeps every input unchanged until every member has read it.
func allGatherArena[T Float](o *opState, out []T, offs []int, bufs [][]byte, copyOwn func()) error {
	k := o.c.me
	copyOwn()
	for j, b := range bufs {
		if j != k {
			copy(out[offs[j]:offs[j+1]], asElems[T](b))
		}
	}
	return arenaSync(o, 1)
}

// reduceScatterArena sums this rank's chunk of every member's input, read in
// their arenas, into out, in member order.
func reduceScatterArena[T Float](o *opState, in, out []T, offs []int, bufs [][]byte, op ReduceOp) error {
	c := o.c
	n, k := len(c.ranks), c.me
	lo, hi := offs[k], offs[k+1]
	own := in[lo:hi]
	if len(out) > 0 && &out[0] == &own[0] && k != 0 {
		// out is our own chunk, which member 0's overwrites first.
		s := asElems[T](c.scratchBytes(len(own) * o.esize))
		copy(s, own)
		own = s
	}
	for j := 0; j < n; j++ {
		src := own
		if j != k {
			src = asElems[T](bufs[j])[lo:hi]
		}
		if j == 0 {
			copy(out, src)
		} else {
			reduceInto(out, src, op)
		}
	}
	if op == Avg {
		scale(out, n)
	}
	return arenaSync(o, 1)
}

// allReduceArena reduces this rank's balanced chunk of every member's buf
// into its own buf, then, once every chunk is reduced, copies the others'
// reduced chunks from their bufs. Each chunk is reduced once, at one member,
// so every member ends with the same bits.
func allReduceArena[T Float](o *opState, buf []T, bufs [][]byte, op ReduceOp) error {
	c := o.c
	n, k := len(c.ranks), c.me
	lo, hi := balanced(len(buf), n, k)
	mine := buf[lo:hi] // only this rank reads its chunk of any buf
	for j := 0; j < n; j++ {
		if j != k {
			reduceInto(mine, asElems[T](bufs[j])[lo:hi], op)
		}
	}
	if op == Avg {
		scale(mine, n)
	}
	// Every chunk reduced; no member reads another's original values again.
	if err := arenaSync(o, 1); err != nil {
		return err
	}
	for j := 0; j < n; j++ {
		if j != k {
			jl, jh := balanced(len(buf), n, j)
			copy(buf[jl:jh], asElems[T](bufs[j])[jl:jh])
		}
	}
	return arenaSync(o, 2)
}
