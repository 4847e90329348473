package models_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/placement"
)

// dpGPT is the small GPT of the data-parallel tests on mesh: 2 blocks of
// width 16, 4 heads, 4 sequences of 8 positions.
func dpGPT(t *testing.T, mesh string) models.GPTConfig {
	cfg := moeGPT(t, mesh, 0, 0)
	cfg.Context, cfg.Batch = 8, 4
	return cfg
}

// TestGPTDataParallel: the batch split over dp (each dp rank 2 whole
// sequences; with cp, each split over cp in the zigzag layout) gives the
// losses of the whole batch on one rank for 10 steps; dp=2,tp=2 and
// dp=2,cp=2,tp=2 give tp=2's.
func TestGPTDataParallel(t *testing.T) {
	const steps, tol = 10, 1e-4
	refs := map[string][]float64{}
	for _, tc := range []struct{ ref, mesh string }{{"tp=1", "dp=2"}, {"tp=1", "dp=2,cp=2"}, {"tp=2", "dp=2,tp=2"}, {"tp=2", "dp=2,cp=2,tp=2"}} {
		if refs[tc.ref] == nil {
			refs[tc.ref] = trainMoE(t, dpGPT(t, tc.ref), steps).losses
		}
		ref := refs[tc.ref]
		mid := time.Now()
		got := trainMoE(t, dpGPT(t, tc.mesh), steps)
		worst := sameLosses(t, tc.mesh, got.losses, ref, tol)
		t.Logf("%s against %s: worst relative difference %.2g over %d steps (loss %.4f → %.4f); %s %v",
			tc.mesh, tc.ref, worst, steps, ref[0], ref[steps-1], tc.mesh, time.Since(mid).Round(time.Millisecond))
		if !(ref[steps-1] < ref[0]) {
			t.Errorf("%s: loss does not fall: %v", tc.ref, ref)
		}
	}
}

// TestGPTDataParallelRefused: the settings data parallelism refuses, each
// with one line naming what is wrong; the parameters are those of the model
// without dp, replicated over it.
func TestGPTDataParallelRefused(t *testing.T) {
	for _, tc := range []struct {
		name, mesh string
		edit       func(*models.GPTConfig)
		want       string
	}{
		{"batch", "dp=2,tp=2", func(c *models.GPTConfig) { c.Batch = 3 }, "batch 3 is not a multiple of dp = 2"},
		{"batch dp=4", "dp=4", func(c *models.GPTConfig) { c.Batch = 6 }, "batch 6 is not a multiple of dp = 4"},
		{"context", "dp=2,cp=2", func(c *models.GPTConfig) { c.Context = 6 }, "context 6 is not a multiple of 2·cp = 4"},
		{"sequence parallel", "dp=2,tp=2", func(c *models.GPTConfig) { c.SequenceParallel = true }, "data parallelism (dp) does not combine with sequence parallelism"},
		{"experts", "dp=2,tp=2", func(c *models.GPTConfig) { c.Experts, c.TopK = 2, 1 }, "data parallelism (dp) does not combine with experts"},
		{"mesh order cp", "cp=2,dp=2", func(*models.GPTConfig) {}, "dp=D,cp=C"},
		{"mesh order tp", "dp=2,tp=2,cp=2", func(*models.GPTConfig) {}, "dp=D,cp=C"},
		{"tp first", "tp=2,dp=2", func(*models.GPTConfig) {}, "dp=D,tp=N"},
	} {
		cfg := dpGPT(t, tc.mesh)
		tc.edit(&cfg)
		_, err := models.PlanGPT(cfg, false)
		if err == nil || !errors.Is(err, linear.ErrConfig) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line naming %q", tc.name, err, tc.want)
		}
	}
	want, _ := models.PlanGPT(dpGPT(t, "tp=2"), true)
	for _, mesh := range []string{"dp=2,tp=2", "dp=2,cp=2,tp=2"} {
		ps, err := models.PlanGPT(dpGPT(t, mesh), true)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) != len(want) {
			t.Fatalf("%s lists %d tensors, tp=2 %d", mesh, len(ps), len(want))
		}
		for i, p := range ps {
			n := len(p.Spec.Placements)
			if p.Name != want[i].Name || p.Spec.Placements[n-1] != want[i].Spec.Placements[0] {
				t.Errorf("%s: %s %s, want %s %s", mesh, p.Name, p.Spec, want[i].Name, want[i].Spec)
			}
			for _, q := range p.Spec.Placements[:n-1] {
				if q != (placement.Replicate{}) {
					t.Errorf("%s: %s %s, want it replicated over dp and cp", mesh, p.Name, p.Spec)
				}
			}
		}
	}
}
