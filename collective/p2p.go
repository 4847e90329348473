package collective

import (
	"context"
	"fmt"
	"runtime"

	"github.com/meshrun/meshrun/tensor"
)

// PointToPoint is a Communicator's moving one member's tensor to another
// (what a pipeline's stages pass on): Send sends buf to group member peer,
// whose Recv from this member receives it into a tensor of the same dtype
// and length, on the communicator's device. Every backend has it: host (the
// Group's Send and Recv), staged (the device buffer copied out, sent,
// received and copied in, in rounds), nccl (ncclSend and ncclRecv).
//
// Sends to a peer match its receives from this member in order. The
// descriptor (dtype, length, the pair's sequence number) travels first, over
// the Group's transport, so a pair that disagrees fails both members with
// both descriptors before any data moves; deadlines, aborts and culprits
// are the collectives'. A communicator runs one call at a time, its wait
// included: traffic both ways between two members takes one communicator
// per direction (World.Communicator of the ranks in either order), or a
// send would wait behind a receive that waits for the peer's send.
type PointToPoint interface {
	Send(ctx context.Context, buf *tensor.Tensor, peer int) error
	Recv(ctx context.Context, buf *tensor.Tensor, peer int) error
}

// after is device memory with a stream of its own (a link's: World.Link)
// that can order it after the device's main stream, where the kernels run:
// a send waits there for the kernels that wrote its buffer.
type after interface{ After() error }

// withStream is device memory that can make a memory of the same device
// with a stream of its own (kernels/cuda's, kernels/sim's).
type withStream interface {
	WithStream() (tensor.Memory, error)
}

// Link returns the two communicators between this rank and world rank peer
// on mem's device, one per direction: out carries this rank's tensors to
// peer (this rank its member 0, peer member 1), in the peer's to this rank
// (peer member 0). Each is a group of the two of its own, apart from
// World.Group's and Communicator's of the same ranks, so that its calls
// never wait behind theirs, or behind the other direction's (the backend is
// chosen as Communicator chooses). On a device whose memory can make a
// stream of its own (a GPU's), a library communicator's work runs on that
// stream, apart from the kernels': a receive posted ahead, or a send
// waiting for the neighbour, never holds the kernels back; a send's stream
// first waits for the kernels queued before it. Both ranks call Link, in
// the same order with respect to their other groups' creation; the pair
// is cached.
func (w *World) Link(ctx context.Context, peer int, mem tensor.Memory) (out, in Communicator, err error) {
	if w.parent != nil {
		p := w.global([]int{peer})[0]
		return w.root().Link(ctx, p, mem)
	}
	me := w.rank
	if peer == me || peer < 0 || peer >= w.size {
		return nil, nil, invalid("link from rank %d to rank %d (world of %d)", me, peer, w.size)
	}
	// The lower rank's direction first, on both ranks: group creation is
	// sequenced.
	dirs := [][2]int{{me, peer}, {peer, me}}
	if peer < me {
		dirs[0], dirs[1] = dirs[1], dirs[0]
	}
	var made [2]Communicator
	for i, d := range dirs {
		ranks := d[:]
		made[i], err = w.cachedComm(ctx, commKey{fmt.Sprintf("link %v", ranks), mem.Device()}, fmt.Sprintf("%d to %d", d[0], d[1]),
			func() (*Group, tensor.Memory, error) {
				g, err := w.group(ctx, ranks, "link ", false)
				if err != nil {
					return nil, nil, err
				}
				if ws, ok := mem.(withStream); ok && mem.Device().Kind != tensor.CPU {
					m, err := ws.WithStream()
					return g, m, err
				}
				return g, mem, nil
			})
		if err != nil {
			return nil, nil, err
		}
	}
	// A library communicator is made now, one direction after the other
	// on both ranks: made at their first calls, the two directions'
	// ncclCommInitRank would run at once, each holding its rank's device
	// (its Run) while it waits for the peer, which holds its own for the
	// other direction.
	for _, c := range made {
		if s, ok := c.(interface{ start(context.Context) error }); ok {
			if err := s.start(ctx); err != nil {
				return nil, nil, err
			}
		}
	}
	if peer < me {
		made[0], made[1] = made[1], made[0]
	}
	return made[0], made[1], nil
}

// start makes the library's communicator now instead of at the first call:
// a barrier of the group (the members' descriptors checked), then
// ncclCommInitRank.
func (c *ncclComm) start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	o, err := c.g.begin(ctx, OpBarrier, 0, 0, 0, 0)
	if err != nil {
		return err
	}
	err = dissemination(o)
	if err == nil {
		err = o.drain()
	}
	if err == nil {
		err = c.init(o)
	}
	return c.g.end(o, err)
}

// peerOK refuses a peer outside the group, or this member itself.
func peerOK(g *Group, op string, peer int) error {
	if peer < 0 || peer >= g.Size() || peer == g.me {
		return invalid("%s: peer %d (group of %d, self %d)", op, peer, g.Size(), g.me)
	}
	return nil
}

func (c *hostComm) Send(ctx context.Context, buf *tensor.Tensor, peer int) error {
	dt, err := onHost(buf)
	if err != nil {
		return err
	}
	return hostP2P(ctx, c.g, dt, tensor.HostBytes(buf), peer, true)
}

func (c *hostComm) Recv(ctx context.Context, buf *tensor.Tensor, peer int) error {
	dt, err := onHost(buf)
	if err != nil {
		return err
	}
	return hostP2P(ctx, c.g, dt, tensor.HostBytes(buf), peer, false)
}

// hostP2P is the Group's Send (send) or Recv of bytes b holding elements of
// dtype dt.
func hostP2P(ctx context.Context, g *Group, dt tensor.DType, b []byte, peer int, send bool) error {
	switch {
	case dt == tensor.Float64 && send:
		return Send(ctx, g, asElems[float64](b), peer)
	case dt == tensor.Float64:
		return Recv(ctx, g, asElems[float64](b), peer)
	case dt == tensor.BFloat16 && send:
		return Send(ctx, g, asElems[tensor.BF16](b), peer)
	case dt == tensor.BFloat16:
		return Recv(ctx, g, asElems[tensor.BF16](b), peer)
	case send:
		return Send(ctx, g, asElems[float32](b), peer)
	}
	return Recv(ctx, g, asElems[float32](b), peer)
}

// Send copies buf out of the device round by round, each round sent as the
// Group's Send while the next is copied.
func (s *staged) Send(ctx context.Context, buf *tensor.Tensor, peer int) error {
	return s.p2p(ctx, buf, peer, true)
}

// Recv receives round by round, each copied into the device while the next
// arrives.
func (s *staged) Recv(ctx context.Context, buf *tensor.Tensor, peer int) error {
	return s.p2p(ctx, buf, peer, false)
}

func (s *staged) p2p(ctx context.Context, buf *tensor.Tensor, peer int, send bool) error {
	op := "recv"
	if send {
		op = "send"
	}
	if err := peerOK(s.g, op, peer); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := s.flat(buf)
	if err != nil {
		return err
	}
	none := func(int) error { return nil }
	in, out := none, none
	if send {
		in = func(i int) error { return f.in(buf, i) }
	} else {
		out = func(i int) error { return f.out(buf, i) }
	}
	return pipeline(f.rounds, in, func(i int) error { return hostP2P(ctx, s.g, f.dt, f.bytes(i), peer, send) }, out)
}

func (c *ncclComm) Send(ctx context.Context, buf *tensor.Tensor, peer int) error {
	return c.p2p(ctx, buf, peer, true)
}

func (c *ncclComm) Recv(ctx context.Context, buf *tensor.Tensor, peer int) error {
	return c.p2p(ctx, buf, peer, false)
}

// p2p is one ncclSend or ncclRecv: the descriptor (dtype, length, the
// pair's sequence number) sent to the peer or checked against its, then the
// library's call and the wait for it, as run does for a collective.
func (c *ncclComm) p2p(ctx context.Context, buf *tensor.Tensor, peer int, send bool) error {
	dt, err := c.args(buf)
	if err != nil {
		return err
	}
	op, lock, seqs := "recv", &c.g.recvMu, c.g.p2pRecv
	if send {
		op, lock, seqs = "send", &c.g.sendMu, c.g.p2pSend
	}
	if err := peerOK(c.g, op, peer); err != nil {
		return err
	}
	n := buf.Len()
	c.mu.Lock()
	defer c.mu.Unlock()
	o, err := c.g.beginP2P(ctx, lock, dt, n)
	if err != nil {
		return err
	}
	seqs[peer]++
	o.h.Seq = seqs[peer]
	if send {
		o.send(peer, 0, 0, 0, nil)
		err = o.drain()
	} else {
		err = o.recv(peer, 0, 0, 0, nil)
	}
	if err == nil {
		err = c.init(o)
	}
	if err == nil {
		c.algo = "nccl/" + op
		if err = c.do(func() error {
			if send {
				if a, ok := c.mem.(after); ok {
					if err := a.After(); err != nil {
						return err
					}
				}
				return c.comm.Send(at(buf, 0), n, dt, peer)
			}
			return c.comm.Recv(at(buf, 0), n, dt, peer)
		}); err != nil {
			c.abortLocked()
			err = &Error{Kind: ErrLibrary, Rank: c.g.w.rank, Reporter: c.g.w.rank, Detail: err.Error()}
		} else {
			err = c.wait(o)
		}
	}
	runtime.KeepAlive(buf)
	return c.g.end(o, err)
}
