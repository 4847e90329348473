package collective_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/internal/testtime"
	"github.com/meshrun/meshrun/tensor"
)

// onDevice returns rank r's tensor of n float32s in mems[r].
func onDevice(t *testing.T, mems []tensor.Memory, r, n int) *tensor.Tensor {
	d, err := mems[r].Alloc(tensor.Float32, n)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// comm is rank w's world communicator for its memory's device.
func comm(w *collective.World, mems []tensor.Memory) (collective.Communicator, error) {
	ranks := make([]int, w.Size())
	for i := range ranks {
		ranks[i] = i
	}
	return w.Communicator(context.Background(), ranks, mems[w.Rank()])
}

// TestDeviceFaults: through the device-aware communicator, on host buffers,
// on sim device buffers (the staged backend) and on sim buffers through the
// nccl backend over the fake library, a mismatch, a killed rank and a hung
// rank fail every rank with the same typed errors naming the culprit as on a
// host Group.
func TestDeviceFaults(t *testing.T) {
	for _, b := range []collectivetest.Buffers{collectivetest.Host, collectivetest.Sim, collectivetest.NCCL} {
		t.Run(b.String(), func(t *testing.T) {
			// A mismatch is the backend's own check's to report: the
			// fake NCCL, as NCCL, moves what it is given and checks
			// nothing (without the check, these calls would return
			// wrong results or hang). With a deadline of 10 s, a hang
			// fails soon.
			mismatchOpts := b.Options(collective.Options{DataTimeout: 10 * time.Second})
			t.Run("different_op", func(t *testing.T) {
				leak := collectivetest.Goroutines(t)
				ws, mems := localWorlds(t, 4, mismatchOpts), b.Memories(4)
				start := time.Now()
				errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
					c, err := comm(w, mems)
					if err != nil {
						return err
					}
					buf := onDevice(t, mems, w.Rank(), 100000)
					if w.Rank() == 2 {
						return c.AllGather(context.Background(), buf, onDevice(t, mems, 2, 400000), []int{100000, 100000, 100000, 100000})
					}
					return c.AllReduce(context.Background(), buf, collective.Sum)
				})
				expect(t, errs, -1, collective.ErrMismatch, 2, time.Since(start), testtime.Scale(time.Second))
				reportedBy(t, errs, "[0 1 2 3]", "all_gather", "all_reduce")
				closeWithin(t, ws, 5*time.Second)
				leak()
			})
			t.Run("different_count", func(t *testing.T) {
				leak := collectivetest.Goroutines(t)
				ws, mems := localWorlds(t, 3, mismatchOpts), b.Memories(3)
				errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
					c, err := comm(w, mems)
					if err != nil {
						return err
					}
					n := 1000
					if w.Rank() == 1 {
						n = 1001
					}
					return c.AllReduce(context.Background(), onDevice(t, mems, w.Rank(), n), collective.Max)
				})
				expect(t, errs, -1, collective.ErrMismatch, 1, 0, time.Second)
				reportedBy(t, errs, "[0 1 2]", "count=1001", "count=1000")
				closeWithin(t, ws, 5*time.Second)
				leak()
			})
			t.Run("rank_exits", func(t *testing.T) {
				leak := collectivetest.Goroutines(t)
				ws := faultWorlds(t, 4, 2, collectivetest.Fault{After: 10, Close: true}, b.Options(collectivetest.SuiteOptions()))
				mems := b.Memories(4)
				start := time.Now()
				errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
					c, err := comm(w, mems)
					if err != nil {
						return err
					}
					return c.AllReduce(context.Background(), onDevice(t, mems, w.Rank(), 50000), collective.Sum)
				})
				expect(t, errs, 2, collective.ErrPeerLost, 2, time.Since(start), testtime.Scale(2*time.Second))
				closeWithin(t, ws, 5*time.Second)
				leak()
			})
			t.Run("rank_hangs", func(t *testing.T) {
				leak := collectivetest.Goroutines(t)
				o := b.Options(collectivetest.SuiteOptions())
				o.DataTimeout = time.Second
				ws, mems := localWorlds(t, 3, o), b.Memories(3)
				start := time.Now()
				// Rank 1 never enters the second all-reduce.
				errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
					c, err := comm(w, mems)
					if err != nil {
						return err
					}
					buf := onDevice(t, mems, w.Rank(), 5000)
					if err := c.AllReduce(context.Background(), buf, collective.Sum); err != nil {
						return err
					}
					if w.Rank() == 1 {
						time.Sleep(2 * time.Second)
						return nil
					}
					return c.AllReduce(context.Background(), buf, collective.Sum)
				})
				expect(t, errs, 1, collective.ErrTimeout, 1, time.Since(start), o.DataTimeout+testtime.Scale(3*time.Second))
				if !strings.Contains(errs[0].Error(), "never entered") {
					t.Errorf("rank 0: %v", errs[0])
				}
				closeWithin(t, ws, 5*time.Second)
				leak()
			})
		})
	}
}

// reportedBy checks that every rank's error is the collective's of group
// (the caller's group, not one a library made for itself) and says each of
// words (both descriptors).
func reportedBy(t *testing.T, errs []error, group string, words ...string) {
	t.Helper()
	for r, err := range errs {
		var e *collective.Error
		if !errors.As(err, &e) || e.Group != group {
			t.Errorf("rank %d: %v, want the error of group %s", r, err, group)
			continue
		}
		for _, w := range words {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("rank %d: %v, want it to say %q", r, err, w)
			}
		}
	}
}

func closeAll(ws []*collective.World) {
	for _, w := range ws {
		w.Close()
	}
}

// TestBackendChoice: host buffers always take the host backend; device buffers
// take staged under auto and staged, and are refused by host and (without an
// nccl build) nccl, before any data moves.
func TestBackendChoice(t *testing.T) {
	for _, tc := range []struct {
		choice  string
		sim     bool
		backend string
		err     string
	}{
		{"auto", false, "host", ""},
		{"staged", false, "host", ""},
		{"auto", true, "staged", ""},
		{"staged", true, "staged", ""},
		{"host", true, "", "host backend"},
		{"nccl", true, "", "no nccl backend"},
	} {
		ws := localWorlds(t, 2, collective.Options{Collectives: tc.choice})
		mems := collectivetest.Host.Memories(2)
		if tc.sim {
			mems = collectivetest.Sim.Memories(2)
		}
		errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
			c, err := comm(w, mems)
			if err != nil {
				return err
			}
			if c.Backend() != tc.backend {
				t.Errorf("%s, sim %v: backend %s, want %s", tc.choice, tc.sim, c.Backend(), tc.backend)
			}
			if again, _ := comm(w, mems); again != c {
				t.Errorf("%s: a second communicator for the same group and device", tc.choice)
			}
			return c.AllReduce(context.Background(), onDevice(t, mems, w.Rank(), 10), collective.Sum)
		})
		for r, err := range errs {
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, collective.ErrInvalid)) {
				t.Errorf("%s, sim %v, rank %d: %v", tc.choice, tc.sim, r, err)
			}
		}
		closeAll(ws)
	}
	if _, err := collective.NewWorld(collective.LocalTransports(1)[0], collective.LocalControls(1)[0], collective.Options{Collectives: "gloo"}); !errors.Is(err, collective.ErrInvalid) {
		t.Errorf("unknown backend: %v", err)
	}
}
