package linear_test

import (
	"context"
	"sync"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/job"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/redistribute"
	"github.com/meshrun/meshrun/spmd/spmdtest"
	"github.com/meshrun/meshrun/tensor"
)

// TestAccumulation: two micro-batches accumulate their weight and bias gradient
// terms and reduce them once; the result equals the sum of both references.
// Split, each micro-batch's backward runs as BackwardInput, both in flight
// (each in a scratch of its own), then BackwardWeight for each: dx and
// the gradients are the same. A whole backward's dx is in the layer's
// workspace (the second micro-batch's in the first's tensor), BackwardInput's
// in the micro-batch's scratch unless SetPassDX.
func TestAccumulation(t *testing.T) {
	for _, tc := range []struct {
		name        string
		split, pass bool
	}{{"whole", false, false}, {"split", true, false}, {"split-pass", true, true}} {
		t.Run(tc.name, func(t *testing.T) { accumulation(t, tc.split, tc.pass) })
	}
}

func accumulation(t *testing.T, split, pass bool) {
	m := placement.MustMesh([]int{2, 2}, []string{"dp", "tp"})
	k, err := providers.New("cpu", nil)
	if err != nil {
		t.Fatal(err)
	}
	b := spec(t, "12:[R,S(0)]", m)
	cfg := linear.Config{Name: "fc", X: spec(t, "16x8:[S(0),R]", m), W: spec(t, "12x8:[R,S(0)]", m), B: &b, Grads: linear.AllGrads,
		Planner: placement.NewPlanner(spmdtest.LargeLayers, placement.DefaultBudget)} // data parallel over dp, as a wide layer would be

	d1 := linear.RandomData([]int{16, 8}, 12, true, 1)
	d2 := linear.RandomData([]int{16, 8}, 12, true, 2)
	d2.W, d2.B = d1.W, d1.B // same parameters, two batches
	_, _, dw1, db1 := linear.Reference(d1)
	_, _, dw2, db2 := linear.Reference(d2)
	for i := range dw1 {
		dw1[i] += dw2[i]
	}
	for i := range db1 {
		db1[i] += db2[i]
	}
	var mu sync.Mutex
	err = job.InProcess(context.Background(), m.Size(), func(ctx context.Context, w *collective.World) error {
		l, err := linear.New(cfg, w.Rank(), nil)
		if err != nil {
			return err
		}
		if l.W, err = linear.Shard(d1.W, cfg.W, w.Rank()); err != nil {
			return err
		}
		if l.B, err = linear.Shard(d1.B, b, w.Rank()); err != nil {
			return err
		}
		reductions := 0
		rt := linear.Runtime{World: w, Kernels: k, Record: func(name string, ex redistribute.Executed) {
			if (name == "dw" || name == "db") && ex.Kind.Moves() && len(ex.Group) > 1 {
				reductions++
			}
		}}
		l.SetPassDX(pass)
		var saves []*linear.Saved
		var dxs []*tensor.Tensor
		scratch := []linear.Scratch{{}, {}}
		for i, d := range []*linear.Data{d1, d2} {
			x, _ := linear.Shard(d.X, cfg.X, w.Rank())
			dy, _ := linear.Shard(d.DY, l.Bwd.DY.Spec, w.Rank())
			l.SetScratch(scratch[i])
			_, saved, err := l.Forward(ctx, rt, x)
			if err != nil {
				return err
			}
			var dx *tensor.Tensor
			if split {
				dx, err = l.BackwardInput(ctx, rt, dy, saved, i == 0) // the first kept as it is, the second copied
				saves = append(saves, saved)
			} else {
				dx, err = l.Backward(ctx, rt, dy, saved)
			}
			if err != nil {
				return err
			}
			dxs = append(dxs, dx)
			_, want, _, _ := linear.Reference(d)
			full, err := linear.Gather(ctx, w, cfg.X, dx)
			if err != nil {
				return err
			}
			if e := linear.RelErr(full, want); e > 1e-5 {
				t.Errorf("micro-batch %d: dx relative error %.3g", i, e)
			}
		}
		if shared := &dxs[0].Float32()[0] == &dxs[1].Float32()[0]; shared != (!split || pass) {
			t.Errorf("rank %d: the micro-batches' dx in one tensor: %v", w.Rank(), shared)
		}
		for i, saved := range saves {
			l.SetScratch(scratch[i])
			if err := l.BackwardWeight(ctx, rt, saved); err != nil {
				return err
			}
		}
		if reductions != 0 {
			t.Errorf("rank %d reduced weight gradients %d times before Reduce", w.Rank(), reductions)
		}
		dw, db, err := l.Reduce(ctx, rt)
		if err != nil {
			return err
		}
		check := func(name string, got *tensor.Tensor, spec placement.Spec, want []float64) error {
			full, err := linear.Gather(ctx, w, spec, got)
			if err != nil {
				return err
			}
			if e := linear.RelErr(full, want); e > 1e-5 {
				mu.Lock()
				t.Errorf("%s: relative error %.3g", name, e)
				mu.Unlock()
			}
			return nil
		}
		if err := check("dw", dw, cfg.W, dw1); err != nil {
			return err
		}
		if err := check("db", db, b, db1); err != nil {
			return err
		}
		if w.Rank() == 0 && reductions != 2 {
			t.Errorf("Reduce ran %d collectives, want 2 (dw and db over dp)", reductions)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
