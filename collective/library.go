package collective

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/meshrun/meshrun/tensor"
)

// A device library that moves its bytes over the World (package ncclfake)
// works through what follows: a Group of its own, whose calls are the
// library's work inside a collective of the rank's (see Group.lib), an
// exchange of raw bytes over it, and the reduction of the host algorithms.

// LibraryGroup returns the group of ranks that a device library makes for
// itself, told apart by tag (its communicator's unique id) from every other
// group of the same ranks, creating it on first use as Group does. Its
// calls leave the World's state (the collective in flight, the sequence
// numbers) to the rank's collective the library works for, and their
// errors fail the World as the transport reported them.
func (w *World) LibraryGroup(ctx context.Context, ranks []int, tag string) (*Group, error) {
	return w.root().group(ctx, w.global(ranks), tag, true)
}

// Context returns a context canceled when the World fails or closes, the
// failure as its cause.
func (w *World) Context() context.Context { return w.ctx }

// Options returns the World's options, defaults applied.
func (w *World) Options() Options { return w.opts }

// ReduceBytes reduces parts, buffers of dtype dt, in their order (every
// member of a group that reduces the same parts computes the same bits, the
// host algorithms' bits), averaged for Avg: for a device library that
// reduces on the host.
func ReduceBytes(dt tensor.DType, parts [][]byte, op ReduceOp) []byte {
	acc := slices.Clone(parts[0])
	for _, p := range parts[1:] {
		switch dt {
		case tensor.Float64:
			reduceInto(asElems[float64](acc), asElems[float64](p), op)
		case tensor.BFloat16:
			reduceInto(asElems[tensor.BF16](acc), asElems[tensor.BF16](p), op)
		default:
			reduceInto(asElems[float32](acc), asElems[float32](p), op)
		}
	}
	if op == Avg {
		switch dt {
		case tensor.Float64:
			scale(asElems[float64](acc), len(parts))
		case tensor.BFloat16:
			scale(asElems[tensor.BF16](acc), len(parts))
		default:
			scale(asElems[float32](acc), len(parts))
		}
	}
	return acc
}

// exchangeMaxBytes bounds what one member may announce it sends another.
const exchangeMaxBytes = 1 << 40

// Exchange sends out[p] to each member p of a library's group
// (World.LibraryGroup) and returns what each sent this one (in[me] is
// out[me]): per peer, the length in 8 bytes, then the bytes in chunks,
// under one header for every call (no op, dtype, count or root: what the
// members called is never compared). Nothing in it has a deadline: the
// World's failure, which comes with every abort of the library's work,
// ends a wait.
func (g *Group) Exchange(out [][]byte) ([][]byte, error) {
	return g.exchange(out, nil, nil)
}

// ExchangeSome is Exchange between some pairs only, as point-to-point
// calls move data one way: this member sends out[p] only to the members p
// with to[p], and receives only from those with from[p] (in[p] nil from
// the others). Each pair must agree: a member waits for what its from says
// is coming until the peer sends it or the World fails.
func (g *Group) ExchangeSome(out [][]byte, to, from []bool) ([][]byte, error) {
	if len(to) != g.Size() || len(from) != g.Size() {
		return nil, fmt.Errorf("%w: ExchangeSome with %d and %d flags for a group of %d", ErrInvalid, len(to), len(from), g.Size())
	}
	return g.exchange(out, to, from)
}

// exchange is Exchange with every pair (to and from nil) or ExchangeSome's.
func (g *Group) exchange(out [][]byte, sendTo, recvFrom []bool) ([][]byte, error) {
	if !g.lib {
		return nil, fmt.Errorf("%w: Exchange on group %s, which is no library's", ErrInvalid, g.key)
	}
	o, err := g.begin(context.Background(), OpAllToAll, dnone, 0, 0, 0)
	if err != nil {
		return nil, err
	}
	o.dl = Deadline{Done: g.w.ctx.Done(), cause: g.w.ctx}
	n, me := g.Size(), g.me
	in := make([][]byte, n)
	in[me] = out[me]
	lens := make([]byte, 8*n) // read by the sender until g.end
	ce := o.chunkElems()      // in bytes: the header's dtype has none
	err = func() error {
		for i := 1; i < n; i++ {
			to, from := (me+i)%n, (me-i+n)%n
			if sendTo == nil || sendTo[to] {
				l := lens[8*to : 8*to+8]
				binary.LittleEndian.PutUint64(l, uint64(len(out[to])))
				o.send(to, 0, 0, 0, l)
				for k, off := 0, 0; off < len(out[to]); k, off = k+1, off+ce {
					o.send(to, 1, uint32(k), off, out[to][off:min(off+ce, len(out[to]))])
				}
			}
			if recvFrom != nil && !recvFrom[from] {
				continue
			}
			var m [8]byte
			if err := o.recv(from, 0, 0, 0, m[:]); err != nil {
				return err
			}
			size := binary.LittleEndian.Uint64(m[:])
			if size > exchangeMaxBytes {
				return &Error{Kind: ErrCorrupt, Rank: g.ranks[from], Reporter: g.w.rank, Detail: fmt.Sprintf("library exchange: member %d announced %d bytes", from, size)}
			}
			b := make([]byte, size)
			for k, off := 0, 0; off < len(b); k, off = k+1, off+ce {
				if err := o.recv(from, 1, uint32(k), off, b[off:min(off+ce, len(b))]); err != nil {
					return err
				}
			}
			in[from] = b
		}
		return nil
	}()
	return in, g.end(o, err)
}
