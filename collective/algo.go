package collective

import (
	"context"
	"fmt"
)

// The algorithms, written once over Transport via opState.send/recv:
//
//   - direct: every rank sends its contribution to every peer in one message
//     (chunked only past the transport's MaxChunk); used up to Options.SmallBytes.
//     Reductions are applied in rank order so every rank computes the same bits.
//   - ring: reduce-scatter then all-gather around the ring (bandwidth-optimal,
//     2(n-1)/n of the buffer per rank), pipelined in Options.ChunkBytes chunks;
//     a chunk is forwarded as soon as it has been reduced. Each segment is reduced
//     once, at one rank, so replicas agree bit for bit.
//   - chain (broadcast): root -> root+1 -> ..., pipelined by chunk.
//   - pairwise (all-to-all): round i sends to rank+i and receives from rank-i.

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, a...)...)
}

// sendSeg queues seg to peer as chunks; base is the element offset of seg.
func sendSeg[T Float](o *opState, peer int, step uint32, seg []T, base int) int {
	ce := o.chunkElems()
	nc := nchunks(len(seg), ce)
	last := -1
	for c := 0; c < nc; c++ {
		lo, hi := c*ce, min(len(seg), (c+1)*ce)
		last = o.send(peer, step, uint32(c), base+lo, asBytes(seg[lo:hi]))
	}
	return last
}

// recvSeg receives a segment sent by sendSeg.
func recvSeg[T Float](o *opState, peer int, step uint32, seg []T, base int) error {
	ce := o.chunkElems()
	nc := nchunks(len(seg), ce)
	for c := 0; c < nc; c++ {
		lo, hi := c*ce, min(len(seg), (c+1)*ce)
		if err := o.recv(peer, step, uint32(c), base+lo, asBytes(seg[lo:hi])); err != nil {
			return err
		}
	}
	return nil
}

func checkOp(op ReduceOp) error {
	if op > Min {
		return invalid("reduce op %d", op)
	}
	return nil
}

// AllReduce reduces buf element-wise across the group, in place: afterwards
// every rank holds the same bits.
func AllReduce[T Float](ctx context.Context, c *Group, buf []T, op ReduceOp) error {
	if err := checkOp(op); err != nil {
		return err
	}
	o, err := c.begin(ctx, OpAllReduce, dtypeOf[T](), op, len(buf), 0)
	if err != nil {
		return err
	}
	n := len(c.ranks)
	switch {
	case n == 1:
		c.algo = "none"
	case o.small(len(buf)*o.esize) || len(buf) < n:
		c.algo = "direct"
		err = allReduceDirect(o, buf, op)
	default:
		var bufs [][]byte
		bufs, err = arenaBuffers(o, len(buf)*o.esize, true, asBytes(buf), sameLens(n, len(buf)*o.esize))
		switch {
		case err != nil:
		case bufs != nil:
			c.algo = "arena"
			err = allReduceArena(o, buf, bufs, op)
		default:
			c.algo = "ring"
			err = allReduceRing(o, buf, op)
		}
	}
	return c.end(o, err)
}

func allReduceDirect[T Float](o *opState, buf []T, op ReduceOp) error {
	c := o.c
	n, k := len(c.ranks), c.me
	nb := len(buf) * o.esize
	scr := c.scratchBytes(nb * n)
	slot := func(j int) []T { return asElems[T](scr[j*nb : (j+1)*nb]) }
	for i := 1; i < n; i++ {
		sendSeg(o, (k+i)%n, 0, buf, 0)
	}
	for i := 1; i < n; i++ {
		p := (k - i + n) % n
		if err := recvSeg(o, p, 0, slot(p), 0); err != nil {
			return err
		}
	}
	if err := o.drain(); err != nil { // buf is read by the sender until here
		return err
	}
	if len(buf) == 0 {
		return nil
	}
	acc := buf
	if k != 0 {
		acc = slot(0)
	}
	for j := 1; j < n; j++ {
		src := buf
		if j != k {
			src = slot(j)
		}
		reduceInto(acc, src, op)
	}
	if k != 0 {
		copy(buf, acc)
	}
	if op == Avg {
		scale(buf, n)
	}
	return nil
}

// balanced is segment j of n of a buffer of l elements, as placement's
// Balanced split cuts it: the first l mod n segments are one element longer.
func balanced(l, n, j int) (int, int) {
	q, rem := l/n, l%n
	return j*q + min(j, rem), (j+1)*q + min(j+1, rem)
}

func allReduceRing[T Float](o *opState, buf []T, op ReduceOp) error {
	c := o.c
	n, k := len(c.ranks), c.me
	next, prev := (k+1)%n, (k-1+n)%n
	ce := o.chunkElems()
	tmp := asElems[T](c.scratchBytes(ce * o.esize))
	seg := func(j int) (int, []T) { lo, hi := balanced(len(buf), n, j); return lo, buf[lo:hi] }
	// sent[s*ncmax+ch] is the send of chunk ch at reduce-scatter step s (segment
	// k-s); all-gather step s overwrites that segment, so it first waits for it.
	_, s0 := seg(0)
	ncmax := nchunks(len(s0), ce)
	if cap(c.idx) < n*ncmax {
		c.idx = make([]int, n*ncmax)
	}
	sent := c.idx[:n*ncmax]
	// Reduce-scatter: step s sends segment k-s, receives k-s-1 and reduces it.
	base, own := seg(k)
	for ch := 0; ch < nchunks(len(own), ce); ch++ {
		lo, hi := ch*ce, min(len(own), (ch+1)*ce)
		sent[ch] = o.send(next, 0, uint32(ch), base+lo, asBytes(own[lo:hi]))
	}
	for s := 0; s < n-1; s++ {
		r := (k - s - 1 + 2*n) % n
		base, sg := seg(r)
		nc := nchunks(len(sg), ce)
		for ch := 0; ch < nc; ch++ {
			lo, hi := ch*ce, min(len(sg), (ch+1)*ce)
			t := tmp[:hi-lo]
			if err := o.recv(prev, uint32(s), uint32(ch), base+lo, asBytes(t)); err != nil {
				return err
			}
			part := sg[lo:hi]
			reduceInto(part, t, op)
			if s == n-2 && op == Avg {
				scale(part, n)
			}
			// Forward: the next reduce-scatter step, or all-gather step 0.
			i := o.send(next, uint32(s+1), uint32(ch), base+lo, asBytes(part))
			if s+1 < n-1 {
				sent[(s+1)*ncmax+ch] = i
			}
		}
	}
	// All-gather: step s receives segment k-s into place and forwards it.
	for s := 0; s < n-1; s++ {
		r := (k - s + n) % n
		base, sg := seg(r)
		nc := nchunks(len(sg), ce)
		for ch := 0; ch < nc; ch++ {
			lo, hi := ch*ce, min(len(sg), (ch+1)*ce)
			step := uint32(n - 1 + s)
			if err := o.waitSent(sent[s*ncmax+ch]); err != nil {
				return err
			}
			if err := o.recv(prev, step, uint32(ch), base+lo, asBytes(sg[lo:hi])); err != nil {
				return err
			}
			if s < n-2 {
				o.send(next, step+1, uint32(ch), base+lo, asBytes(sg[lo:hi]))
			}
		}
	}
	return nil
}

func offsets(counts []int) ([]int, int, error) {
	offs := make([]int, len(counts)+1)
	for i, c := range counts {
		if c < 0 {
			return nil, 0, invalid("negative count %d", c)
		}
		offs[i+1] = offs[i] + c
	}
	return offs, offs[len(counts)], nil
}

// AllGather concatenates every member's in (counts[j] elements from member j,
// in group order) into out, which has sum(counts) elements. Counts may differ
// (uneven shards); nothing is padded. in may alias its place in out.
func AllGather[T Float](ctx context.Context, c *Group, in, out []T, counts []int) error {
	n, k := len(c.ranks), c.me
	if len(counts) != n {
		return invalid("all_gather: %d counts for a group of %d", len(counts), n)
	}
	offs, total, err := offsets(counts)
	if err != nil {
		return err
	}
	if len(in) != counts[k] || len(out) != total {
		return invalid("all_gather: in has %d elements (count %d), out %d (total %d)", len(in), counts[k], len(out), total)
	}
	o, err := c.begin(ctx, OpAllGather, dtypeOf[T](), 0, total, hashCounts(-1, counts))
	if err != nil {
		return err
	}
	own := out[offs[k]:offs[k+1]]
	// Own segment: sends go out from in, and the copy into out happens while
	// the peers' segments travel.
	copyOwn := func() {
		if len(in) > 0 && &own[0] != &in[0] {
			copy(own, in)
		}
	}
	seg := func(j int) []T { return out[offs[j]:offs[j+1]] }
	switch {
	case n == 1:
		c.algo = "none"
		copyOwn()
	case o.small(total * o.esize):
		c.algo = "direct"
		for i := 1; i < n; i++ {
			sendSeg(o, (k+i)%n, 0, in, offs[k])
		}
		copyOwn()
		for i := 1; i < n && err == nil; i++ {
			p := (k - i + n) % n
			err = recvSeg(o, p, 0, seg(p), offs[p])
		}
	default:
		var bufs [][]byte
		bufs, err = arenaBuffers(o, total*o.esize, false, asBytes(in), byteCounts(counts, o.esize))
		switch {
		case err != nil:
		case bufs != nil:
			c.algo = "arena"
			err = allGatherArena(o, out, offs, bufs, copyOwn)
		default:
			c.algo = "ring"
			err = allGatherRing(o, in, out, offs, copyOwn)
		}
	}
	return c.end(o, err)
}

func allGatherRing[T Float](o *opState, in, out []T, offs []int, copyOwn func()) error {
	c := o.c
	n, k := len(c.ranks), c.me
	next, prev := (k+1)%n, (k-1+n)%n
	ce := o.chunkElems()
	sendSeg(o, next, 0, in, offs[k])
	copyOwn()
	for s := 0; s < n-1; s++ {
		r := (k - s - 1 + n) % n
		sg := out[offs[r]:offs[r+1]]
		nc := nchunks(len(sg), ce)
		for ch := 0; ch < nc; ch++ {
			lo, hi := ch*ce, min(len(sg), (ch+1)*ce)
			if err := o.recv(prev, uint32(s), uint32(ch), offs[r]+lo, asBytes(sg[lo:hi])); err != nil {
				return err
			}
			if s < n-2 {
				o.send(next, uint32(s+1), uint32(ch), offs[r]+lo, asBytes(sg[lo:hi]))
			}
		}
	}
	return nil
}

// ReduceScatter reduces in (sum(counts) elements, the same layout on every
// member) across the group and leaves member j's segment (counts[j] elements)
// in its out. in is not modified.
func ReduceScatter[T Float](ctx context.Context, c *Group, in, out []T, counts []int, op ReduceOp) error {
	if err := checkOp(op); err != nil {
		return err
	}
	n, k := len(c.ranks), c.me
	if len(counts) != n {
		return invalid("reduce_scatter: %d counts for a group of %d", len(counts), n)
	}
	offs, total, err := offsets(counts)
	if err != nil {
		return err
	}
	if len(in) != total || len(out) != counts[k] {
		return invalid("reduce_scatter: in has %d elements (total %d), out %d (count %d)", len(in), total, len(out), counts[k])
	}
	o, err := c.begin(ctx, OpReduceScatter, dtypeOf[T](), op, total, hashCounts(-1, counts))
	if err != nil {
		return err
	}
	switch {
	case n == 1:
		c.algo = "none"
		copy(out, in)
	case o.small(total * o.esize):
		c.algo = "direct"
		err = reduceScatterDirect(o, in, out, offs, op)
	default:
		var bufs [][]byte
		bufs, err = arenaBuffers(o, total*o.esize, false, asBytes(in), sameLens(n, total*o.esize))
		switch {
		case err != nil:
		case bufs != nil:
			c.algo = "arena"
			err = reduceScatterArena(o, in, out, offs, bufs, op)
		default:
			c.algo = "ring"
			err = reduceScatterRing(o, in, out, offs, op)
		}
	}
	return c.end(o, err)
}

func reduceScatterDirect[T Float](o *opState, in, out []T, offs []int, op ReduceOp) error {
	c := o.c
	n, k := len(c.ranks), c.me
	m := offs[k+1] - offs[k]
	scr := asElems[T](c.scratchBytes(m * n * o.esize))
	for i := 1; i < n; i++ {
		p := (k + i) % n
		sendSeg(o, p, 0, in[offs[p]:offs[p+1]], offs[p])
	}
	for i := 1; i < n; i++ {
		p := (k - i + n) % n
		if err := recvSeg(o, p, 0, scr[p*m:(p+1)*m], offs[k]); err != nil {
			return err
		}
	}
	copy(scr[k*m:(k+1)*m], in[offs[k]:offs[k+1]])
	if m > 0 {
		copy(out, scr[:m])
		for j := 1; j < n; j++ {
			reduceInto(out, scr[j*m:(j+1)*m], op)
		}
	}
	if op == Avg {
		scale(out, n)
	}
	return nil
}

func reduceScatterRing[T Float](o *opState, in, out []T, offs []int, op ReduceOp) error {
	c := o.c
	n, k := len(c.ranks), c.me
	next, prev := (k+1)%n, (k-1+n)%n
	ce := o.chunkElems()
	maxc := 0
	for j := 0; j < n; j++ {
		maxc = max(maxc, offs[j+1]-offs[j])
	}
	ncmax := nchunks(maxc, ce)
	slots := asElems[T](c.scratchBytes(2 * maxc * o.esize))
	if cap(c.idx) < 2*ncmax {
		c.idx = make([]int, 2*ncmax)
	}
	idx := c.idx[:2*ncmax]
	for i := range idx {
		idx[i] = -1
	}
	// Step s sends segment k-s-1 and receives k-s-2; the last step receives k.
	r0 := (k - 1 + n) % n
	sendSeg(o, next, 0, in[offs[r0]:offs[r0+1]], offs[r0])
	for s := 0; s < n-1; s++ {
		r := (k - s - 2 + 2*n) % n
		m := offs[r+1] - offs[r]
		var dst []T
		last := s == n-2
		if last {
			dst = out
		} else {
			dst = slots[(s%2)*maxc : (s%2)*maxc+m]
		}
		nc := nchunks(m, ce)
		for ch := 0; ch < nc; ch++ {
			lo, hi := ch*ce, min(m, (ch+1)*ce)
			si := (s%2)*ncmax + ch
			if !last && idx[si] >= 0 {
				if err := o.waitSent(idx[si]); err != nil {
					return err
				}
			}
			part := dst[lo:hi]
			if err := o.recv(prev, uint32(s), uint32(ch), offs[r]+lo, asBytes(part)); err != nil {
				return err
			}
			reduceInto(part, in[offs[r]+lo:offs[r]+hi], op)
			if last {
				if op == Avg {
					scale(part, n)
				}
				continue
			}
			idx[si] = o.send(next, uint32(s+1), uint32(ch), offs[r]+lo, asBytes(part))
		}
	}
	return nil
}

// Broadcast copies root's buf (root is a group index) to every member's buf.
func Broadcast[T Float](ctx context.Context, c *Group, buf []T, root int) error {
	n, k := len(c.ranks), c.me
	if root < 0 || root >= n {
		return invalid("broadcast: root %d outside group of %d", root, n)
	}
	o, err := c.begin(ctx, OpBroadcast, dtypeOf[T](), 0, len(buf), hashCounts(root, nil))
	if err != nil {
		return err
	}
	switch {
	case n == 1:
		c.algo = "none"
	case o.small(len(buf) * o.esize):
		c.algo = "direct"
		if k == root {
			for i := 1; i < n; i++ {
				sendSeg(o, (k+i)%n, 0, buf, 0)
			}
		} else {
			err = recvSeg(o, root, 0, buf, 0)
		}
	default:
		c.algo = "chain"
		pos := (k - root + n) % n
		ce := o.chunkElems()
		nc := nchunks(len(buf), ce)
		for ch := 0; ch < nc && err == nil; ch++ {
			lo, hi := ch*ce, min(len(buf), (ch+1)*ce)
			if pos > 0 {
				err = o.recv((k-1+n)%n, 0, uint32(ch), lo, asBytes(buf[lo:hi]))
			}
			if err == nil && pos < n-1 {
				o.send((k+1)%n, 0, uint32(ch), lo, asBytes(buf[lo:hi]))
			}
		}
	}
	return c.end(o, err)
}

// allToAllCounts checks an all-to-all's counts for member k of n against its
// buffers' lengths; it returns the send and receive offsets.
func allToAllCounts(n, k int, sendCounts, recvCounts []int, sendLen, recvLen int) (so, ro []int, err error) {
	if len(sendCounts) != n || len(recvCounts) != n {
		return nil, nil, invalid("all_to_all: %d send and %d recv counts for a group of %d", len(sendCounts), len(recvCounts), n)
	}
	so, st, err := offsets(sendCounts)
	if err != nil {
		return nil, nil, err
	}
	ro, rt, err := offsets(recvCounts)
	if err != nil {
		return nil, nil, err
	}
	if sendLen != st || recvLen != rt {
		return nil, nil, invalid("all_to_all: send has %d elements (want %d), recv %d (want %d)", sendLen, st, recvLen, rt)
	}
	if sendCounts[k] != recvCounts[k] {
		return nil, nil, invalid("all_to_all: rank sends itself %d elements but expects %d", sendCounts[k], recvCounts[k])
	}
	return so, ro, nil
}

// AllToAll sends send[sendOffs(j)...] (sendCounts[j] elements) to member j and
// receives recvCounts[j] elements from member j into recv, in group order. Each
// pair's counts must agree (checked on the wire).
func AllToAll[T Float](ctx context.Context, c *Group, send []T, sendCounts []int, recv []T, recvCounts []int) error {
	n, k := len(c.ranks), c.me
	so, ro, err := allToAllCounts(n, k, sendCounts, recvCounts, len(send), len(recv))
	if err != nil {
		return err
	}
	o, err := c.begin(ctx, OpAllToAll, dtypeOf[T](), 0, 0, 0)
	if err != nil {
		return err
	}
	c.algo = "pairwise"
	copy(recv[ro[k]:ro[k+1]], send[so[k]:so[k+1]])
	for i := 1; i < n; i++ {
		p := (k + i) % n
		o.h.Count = uint64(sendCounts[p]) // each pair agrees on its own count
		sendSeg(o, p, 0, send[so[p]:so[p+1]], 0)
	}
	for i := 1; i < n && err == nil; i++ {
		p := (k - i + n) % n
		o.h.Count = uint64(recvCounts[p])
		err = recvSeg(o, p, 0, recv[ro[p]:ro[p+1]], 0)
	}
	return c.end(o, err)
}

// Send sends buf to group member peer; the peer must Recv a buffer of the same
// length. Sends to a peer are matched with its receives in order.
func Send[T Float](ctx context.Context, c *Group, buf []T, peer int) error {
	if peer < 0 || peer >= len(c.ranks) || peer == c.me {
		return invalid("send: peer %d (group of %d, self %d)", peer, len(c.ranks), c.me)
	}
	o, err := c.beginP2P(ctx, &c.sendMu, dtypeOf[T](), len(buf))
	if err != nil {
		return err
	}
	c.p2pSend[peer]++
	o.h.Seq = c.p2pSend[peer]
	sendSeg(o, peer, 0, buf, 0)
	return c.end(o, o.err)
}

// Recv receives into buf what group member peer sent with Send.
func Recv[T Float](ctx context.Context, c *Group, buf []T, peer int) error {
	if peer < 0 || peer >= len(c.ranks) || peer == c.me {
		return invalid("recv: peer %d (group of %d, self %d)", peer, len(c.ranks), c.me)
	}
	o, err := c.beginP2P(ctx, &c.recvMu, dtypeOf[T](), len(buf))
	if err != nil {
		return err
	}
	c.p2pRecv[peer]++
	o.h.Seq = c.p2pRecv[peer]
	return c.end(o, recvSeg(o, peer, 0, buf, 0))
}

// Algorithm names the algorithm of the communicator's last collective ("ring",
// "direct", "chain", "pairwise", "none").
func (c *Group) Algorithm() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.algo
}

// sameLens is n lengths of bytes each.
func sameLens(n, bytes int) []int {
	l := make([]int, n)
	for i := range l {
		l[i] = bytes
	}
	return l
}

// byteCounts is counts of elements of esize bytes, in bytes.
func byteCounts(counts []int, esize int) []int {
	b := make([]int, len(counts))
	for i, n := range counts {
		b[i] = n * esize
	}
	return b
}
