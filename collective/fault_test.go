package collective_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/internal/testtime"
)

// faultWorlds builds n local worlds; rank victim's transport is wrapped with f.
func faultWorlds(t *testing.T, n, victim int, f collectivetest.Fault, o collective.Options) []*collective.World {
	ts := collective.LocalTransports(n)
	cs := collective.LocalControls(n)
	ws := make([]*collective.World, n)
	for i := range ws {
		tr := ts[i]
		if i == victim {
			tr = &collectivetest.FaultTransport{Transport: tr, F: f}
		}
		w, err := collective.NewWorld(tr, cs[i], o)
		if err != nil {
			t.Fatal(err)
		}
		ws[i] = w
	}
	return ws
}

// expect checks that every rank but skip failed with kind naming culprit within
// limit, and returns the errors' texts.
func expect(t *testing.T, errs []error, skip int, kind error, culprit int, took, limit time.Duration) {
	t.Helper()
	if took > limit {
		t.Errorf("failing took %v, limit %v", took, limit)
	}
	for r, err := range errs {
		if r == skip {
			continue
		}
		if !errors.Is(err, kind) {
			t.Fatalf("rank %d: got %v, want %v", r, err, kind)
		}
		if got := collective.Culprit(err); culprit >= -1 && got != culprit { // culprit < -1: any
			t.Fatalf("rank %d: culprit %d, want %d: %v", r, got, culprit, err)
		}
	}
}

func worldComms(ws []*collective.World) error {
	errs := collectivetest.RunRanks(ws, func(w *collective.World) error { _, err := w.WorldGroup(context.Background()); return err })
	return errors.Join(errs...)
}

func TestFaultDifferentOp(t *testing.T) {
	for _, name := range []string{"local", "tcp"} {
		t.Run(name, func(t *testing.T) {
			job := bootstraptest.NewJob()
			s := bootstraptest.StartServer(t, job)
			leak := collectivetest.Goroutines(t)
			var ws []*collective.World
			if name == "local" {
				ws = localWorlds(t, 4, collective.Options{})
			} else {
				ws = bootstraptest.JoinWorlds(t, s, job, 4, "tcp", collective.Options{})
			}
			start := time.Now()
			errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
				c, err := w.WorldGroup(context.Background())
				if err != nil {
					return err
				}
				buf := make([]float32, 100000)
				if w.Rank() == 2 {
					out := make([]float32, 4*len(buf))
					return collective.AllGather(context.Background(), c, buf, out, []int{len(buf), len(buf), len(buf), len(buf)})
				}
				return collective.AllReduce(context.Background(), c, buf, collective.Sum)
			})
			took := time.Since(start)
			if limit := testtime.Scale(time.Second); took > limit {
				t.Errorf("took %v, limit %v", took, limit)
			}
			for r, err := range errs {
				if !errors.Is(err, collective.ErrMismatch) {
					t.Fatalf("rank %d: %v", r, err)
				}
				if s := err.Error(); !strings.Contains(s, "all_gather") || !strings.Contains(s, "all_reduce") {
					t.Fatalf("rank %d: error lacks both descriptors: %v", r, err)
				}
				if c := collective.Culprit(err); c != 2 {
					t.Fatalf("rank %d: culprit %d, want 2: %v", r, c, err)
				}
			}
			t.Logf("rank 0: %v", errs[0])
			for _, w := range ws {
				w.Close()
			}
			leak()
		})
	}
}

func TestFaultDifferentCount(t *testing.T) {
	leak := collectivetest.Goroutines(t)
	ws := localWorlds(t, 3, collective.Options{})
	if err := worldComms(ws); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
		c, _ := w.WorldGroup(context.Background())
		n := 1000
		if w.Rank() == 1 {
			n = 1001
		}
		return collective.AllReduce(context.Background(), c, make([]float64, n), collective.Max)
	})
	for r, err := range errs {
		if !errors.Is(err, collective.ErrMismatch) || !strings.Contains(err.Error(), "count=1001") || !strings.Contains(err.Error(), "count=1000") || collective.Culprit(err) != 1 {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if d, limit := time.Since(start), testtime.Scale(time.Second); d > limit {
		t.Errorf("took %v, limit %v", d, limit)
	}
	for _, w := range ws {
		w.Close()
	}
	leak()
}

func TestFaultCountChangedMidStream(t *testing.T) {
	leak := collectivetest.Goroutines(t)
	ws := faultWorlds(t, 4, 3, collectivetest.Fault{After: 20, Count: 1}, collectivetest.SuiteOptions())
	if err := worldComms(ws); err != nil {
		t.Fatal(err)
	}
	errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
		c, _ := w.WorldGroup(context.Background())
		return collective.AllReduce(context.Background(), c, make([]float32, 50000), collective.Sum)
	})
	expect(t, errs, -1, collective.ErrMismatch, 3, 0, time.Second)
	for _, w := range ws {
		w.Close()
	}
	leak()
}

func TestFaultRankExits(t *testing.T) {
	leak := collectivetest.Goroutines(t)
	ws := faultWorlds(t, 4, 2, collectivetest.Fault{After: 10, Close: true}, collectivetest.SuiteOptions())
	if err := worldComms(ws); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
		c, _ := w.WorldGroup(context.Background())
		return collective.AllReduce(context.Background(), c, make([]float32, 50000), collective.Sum)
	})
	expect(t, errs, 2, collective.ErrPeerLost, 2, time.Since(start), testtime.Scale(2*time.Second))
	for _, w := range ws {
		w.Close()
	}
	leak()
}

func TestFaultRankHangs(t *testing.T) {
	leak := collectivetest.Goroutines(t)
	o := collectivetest.SuiteOptions()
	o.DataTimeout = time.Second
	// Rank 1 never enters the second all-reduce.
	ws := localWorlds(t, 3, o)
	if err := worldComms(ws); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	errs := collectivetest.RunRanks(ws, func(w *collective.World) error {
		c, _ := w.WorldGroup(context.Background())
		buf := make([]float32, 5000)
		if err := collective.AllReduce(context.Background(), c, buf, collective.Sum); err != nil {
			return err
		}
		if w.Rank() == 1 {
			time.Sleep(2 * time.Second)
			return nil
		}
		return collective.AllReduce(context.Background(), c, buf, collective.Sum)
	})
	expect(t, errs, 1, collective.ErrTimeout, 1, time.Since(start), o.DataTimeout+2*time.Second+testtime.Scale(time.Second))
	if !strings.Contains(errs[0].Error(), "never entered") {
		t.Errorf("rank 0: %v", errs[0])
	}
	t.Logf("rank 0: %v", errs[0])
	for _, w := range ws {
		w.Close()
	}
	leak()
}

func TestFaultCallerCancel(t *testing.T) {
	leak := collectivetest.Goroutines(t)
	ws := localWorlds(t, 2, collective.Options{})
	if err := worldComms(ws); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	c, _ := ws[0].WorldGroup(context.Background())
	err := collective.AllReduce(ctx, c, make([]float32, 10), collective.Sum)
	if !errors.Is(err, collective.ErrAborted) {
		t.Fatalf("%v", err)
	}
	// The peer learns of it (its World fails; a call already matched by rank 0's
	// message may still complete, correctly).
	for i := 0; i < 100 && ws[1].Err() == nil; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if err := ws[1].Err(); !errors.Is(err, collective.ErrAborted) || collective.Culprit(err) != 0 {
		t.Fatalf("peer: %v", err)
	}
	for _, w := range ws {
		w.Close()
	}
	leak()
}

func TestFaultCloseWhileWaiting(t *testing.T) {
	for _, tr := range []string{"shm", "tcp", "nats"} {
		t.Run(tr, func(t *testing.T) {
			job := bootstraptest.NewJob()
			s := bootstraptest.StartServer(t, job)
			leak := collectivetest.Goroutines(t)
			ws := bootstraptest.JoinWorlds(t, s, job, 2, tr, collective.Options{})
			err := worldComms(ws)
			c, _ := ws[0].WorldGroup(context.Background())
			if err == nil {
				errc := make(chan error, 1)
				go func() { errc <- collective.AllReduce(context.Background(), c, make([]float32, 1<<20), collective.Sum) }()
				time.Sleep(100 * time.Millisecond)
				ws[1].Close()
				select {
				case err = <-errc:
				case <-time.After(testtime.Scale(5 * time.Second)):
					err = fmt.Errorf("still waiting %v after the peer closed", testtime.Scale(5*time.Second))
				}
			}
			if !errors.Is(err, collective.ErrPeerLost) || collective.Culprit(err) != 1 {
				t.Fatalf("%v", err)
			}
			ws[0].Close()
			leak()
		})
	}
}
