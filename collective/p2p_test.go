package collective_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/tensor"
)

// fill writes v(i) into device tensor t through its memory.
func fill(t *testing.T, mem tensor.Memory, d *tensor.Tensor, v func(i int) float32) {
	t.Helper()
	h := tensor.New(tensor.Float32, d.Len())
	for i := range h.Float32() {
		h.Float32()[i] = v(i)
	}
	if err := mem.Write(d, 0, tensor.HostBytes(h), tensor.Transfer); err != nil {
		t.Fatal(err)
	}
}

// read returns device tensor d's float32s.
func read(t *testing.T, mem tensor.Memory, d *tensor.Tensor) []float32 {
	t.Helper()
	h := tensor.New(tensor.Float32, d.Len())
	if err := mem.Read(tensor.HostBytes(h), d, 0, tensor.Transfer); err != nil {
		t.Fatal(err)
	}
	return h.Float32()
}

// TestLinks: a pipeline's traffic between neighbours of 3 ranks (0 ⇄ 1 ⇄ 2)
// through World.Link's communicators, one per direction, on host buffers,
// on sim buffers (the staged backend, in rounds: the link's tensors are
// larger than a round) and on sim buffers through the nccl backend over the
// fake library: every rank sends its neighbours 5 tensors each way while
// they send it theirs, every tensor arrives whole and in order, and a link
// is one communicator per direction, cached.
func TestLinks(t *testing.T) {
	for _, b := range []collectivetest.Buffers{collectivetest.Host, collectivetest.Sim, collectivetest.NCCL} {
		t.Run(b.String(), func(t *testing.T) {
			leak := collectivetest.Goroutines(t)
			o := b.Options(collectivetest.SuiteOptions())
			o.StageBytes = 4096
			const n, msgs = 3000, 5
			ws, mems := localWorlds(t, 3, o), b.Memories(3)
			val := func(from, to, k, i int) float32 { return float32(1000*from + 100*to + 10*k + i%7) }
			errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
				me, ctx := w.Rank(), context.Background()
				errc := make(chan error, 4)
				for _, peer := range []int{me - 1, me + 1} {
					if peer < 0 || peer > 2 {
						errc <- nil
						errc <- nil
						continue
					}
					out, in, err := w.Link(ctx, peer, mems[me])
					if err != nil {
						return err
					}
					if again, _, _ := w.Link(ctx, peer, mems[me]); again != out || out == in {
						return fmt.Errorf("rank %d: the link to %d is not one communicator per direction, cached", me, peer)
					}
					go func() {
						for k := range msgs {
							d := onDevice(t, mems, me, n)
							fill(t, mems[me], d, func(i int) float32 { return val(me, peer, k, i) })
							if err := out.Send(ctx, d, 1); err != nil {
								errc <- err
								return
							}
						}
						errc <- nil
					}()
					go func() {
						for k := range msgs {
							d := onDevice(t, mems, me, n)
							if err := in.Recv(ctx, d, 0); err != nil {
								errc <- err
								return
							}
							for i, v := range read(t, mems[me], d) {
								if want := val(peer, me, k, i); v != want {
									errc <- fmt.Errorf("rank %d: message %d from %d: element %d is %v, want %v", me, k, peer, i, v, want)
									return
								}
							}
						}
						errc <- nil
					}()
				}
				for range 4 {
					if err := <-errc; err != nil {
						return err
					}
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
			closeWithin(t, ws, 5*time.Second)
			leak()
		})
	}
}

// TestLinkMismatch: a receive of another length than the send's fails
// with both descriptors before any data moves, and fails the World: the
// sender's send (which NCCL's holds until the peer takes it) or its next
// call fails with the same error. A send to itself or to a member outside
// the link is refused, and so is a link to itself.
func TestLinkMismatch(t *testing.T) {
	for _, b := range []collectivetest.Buffers{collectivetest.Host, collectivetest.Sim, collectivetest.NCCL} {
		t.Run(b.String(), func(t *testing.T) {
			leak := collectivetest.Goroutines(t)
			ws, mems := localWorlds(t, 2, b.Options(collective.Options{DataTimeout: 10 * time.Second})), b.Memories(2)
			start := time.Now()
			errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
				c, in, err := w.Link(context.Background(), 1-w.Rank(), mems[w.Rank()])
				if err != nil {
					return err
				}
				if w.Rank() == 0 {
					if err := c.Send(context.Background(), onDevice(t, mems, 0, 10), 0); err == nil {
						return fmt.Errorf("a send to itself was taken")
					}
					if err := c.Send(context.Background(), onDevice(t, mems, 0, 10), 2); err == nil {
						return fmt.Errorf("a send outside the link was taken")
					}
					if err := c.Send(context.Background(), onDevice(t, mems, 0, 1000), 1); err != nil {
						return err
					}
					// An eager send returns before the peer's check: the
					// World fails with it.
					for deadline := time.Now().Add(5 * time.Second); w.Err() == nil && time.Now().Before(deadline); {
						time.Sleep(time.Millisecond)
					}
					return w.Err()
				}
				return in.Recv(context.Background(), onDevice(t, mems, 1, 1001), 0)
			})
			expect(t, errs, -1, collective.ErrMismatch, 1, time.Since(start), 5*time.Second)
			reportedBy(t, errs, "link [0 1]", "count=1000", "count=1001")
			if _, _, err := ws[0].Link(context.Background(), 0, mems[0]); err == nil {
				t.Error("a link from rank 0 to itself was made")
			}
			closeWithin(t, ws, 5*time.Second)
			leak()
		})
	}
}
