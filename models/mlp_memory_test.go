package models_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/job"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// TestMLPMemory: the estimate's parameters are the bytes of the parameters
// PlanMLP lists, and the whole estimate is within a factor of two of what
// building the block and training it for two steps allocates.
func TestMLPMemory(t *testing.T) {
	for _, tc := range []struct {
		mesh string
		sp   bool
		dt   tensor.DType
	}{
		{"tp=2", false, tensor.Float32},
		{"tp=2", true, tensor.Float32},
		{"dp=2,tp=2", false, tensor.Float32},
		{"tp=2", false, tensor.BFloat16},
	} {
		m, err := placement.ParseMesh(tc.mesh)
		if err != nil {
			t.Fatal(err)
		}
		cfg := models.MLPConfig{Mesh: m, Tokens: 64, Hidden: 256, FFN: 2048, SequenceParallel: tc.sp, Seed: 1, LR: 0.05, DType: tc.dt}
		ps, mem, err := models.CheckMLP(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var params int64
		for _, p := range ps {
			params += p.Spec.LocalElems(0) * 4
		}
		if tc.dt == tensor.BFloat16 {
			params += params / 2 // the bfloat16 copies the GEMMs read
		}
		if mem.Params != params {
			t.Errorf("%s: estimate's params %d B, PlanMLP's %d B", tc.mesh, mem.Params, params)
		}
		kern := "cpu"
		k, err := providers.New(kern, nil)
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		err = job.InProcess(context.Background(), m.Size(), func(ctx context.Context, w *collective.World) error {
			b, err := models.NewMLP(cfg, w.Rank(), nil)
			if err != nil {
				return err
			}
			for s := 0; s < 2; s++ {
				if _, err := b.Step(ctx, linear.Runtime{World: w, Kernels: k}); err != nil {
					return err
				}
			}
			return nil
		})
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		got, est := int64(after.TotalAlloc-before.TotalAlloc)/int64(m.Size()), mem.Total()
		t.Logf("%s sp=%v %s: estimate %s, allocated %d B per rank", tc.mesh, tc.sp, tc.dt, mem, got)
		if est < got/2 || est > 2*got {
			t.Errorf("%s sp=%v %s: estimate %s, allocated %d B per rank", tc.mesh, tc.sp, tc.dt, mem, got)
		}
	}
}
