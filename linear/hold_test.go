package linear_test

import (
	"context"
	"slices"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/job"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd/spmdtest"
	"github.com/meshrun/meshrun/tensor"
)

// TestHoldCompute: a bfloat16 layer casts its float32 parameters at every
// Forward, so that it follows a change to them at once; under HoldCompute
// (a pipeline step's micro-batches) it casts once and keeps the copies
// until HoldCompute is called again.
func TestHoldCompute(t *testing.T) {
	m := placement.MustMesh([]int{1}, []string{"tp"})
	k, err := providers.New("cpu", nil)
	if err != nil {
		t.Fatal(err)
	}
	b := spec(t, "12:[R]", m)
	cfg := linear.Config{Name: "fc", X: spec(t, "16x8:[R]", m), W: spec(t, "12x8:[R]", m), B: &b, Grads: linear.AllGrads,
		DType: tensor.BFloat16, Planner: placement.NewPlanner(spmdtest.LargeLayers, placement.DefaultBudget)}
	d := linear.RandomData([]int{16, 8}, 12, true, 3)
	err = job.InProcess(context.Background(), 1, func(ctx context.Context, w *collective.World) error {
		l, err := linear.New(cfg, 0, nil)
		if err != nil {
			return err
		}
		if l.W, err = linear.Shard(d.W, cfg.W, 0); err != nil {
			return err
		}
		if l.B, err = linear.Shard(d.B, b, 0); err != nil {
			return err
		}
		x32, _ := linear.Shard(d.X, cfg.X, 0)
		x := tensor.New(tensor.BFloat16, x32.Shape()...)
		if err := k.Cast(x, x32); err != nil {
			return err
		}
		rt := linear.Runtime{World: w, Kernels: k}
		forward := func() []tensor.BF16 {
			y, _, err := l.Forward(ctx, rt, x)
			if err != nil {
				t.Fatal(err)
			}
			return slices.Clone(y.BFloat16())
		}
		double := func() {
			for i := range l.W.Float32() {
				l.W.Float32()[i] *= 2
			}
		}
		y0 := forward()
		double()
		y1 := forward() // not held: the new weights at once
		if slices.Equal(y0, y1) {
			t.Errorf("a change to W not followed by the next Forward")
		}
		l.HoldCompute(true)
		y2 := forward()
		double()
		if y3 := forward(); !slices.Equal(y2, y3) || !slices.Equal(y1, y2) {
			t.Errorf("held: the copies changed within the step")
		}
		l.HoldCompute(true) // the next step: cast again
		y4 := forward()
		if slices.Equal(y4, y2) {
			t.Errorf("HoldCompute again: the copies were not cast afresh")
		}
		// New parameters set while held are cast at the next Forward.
		w0, _ := linear.Shard(d.W, cfg.W, 0)
		b0, _ := linear.Shard(d.B, b, 0)
		if err := l.SetParams(w0, b0); err != nil {
			return err
		}
		if y := forward(); !slices.Equal(y, y0) {
			t.Errorf("held: SetParams not followed by the next Forward")
		}
		l.HoldCompute(false)
		y5 := forward()
		double()
		if y6 := forward(); slices.Equal(y5, y6) {
			t.Errorf("hold off: a change to W not followed")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
