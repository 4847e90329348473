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

// cpGPT is the small GPT of the context-parallel tests on mesh, with a long
// context: 2 blocks of width 16, 4 heads, 2 sequences of 512 positions.
func cpGPT(t *testing.T, mesh string) models.GPTConfig {
	cfg := moeGPT(t, mesh, 0, 0)
	cfg.Context, cfg.Batch = 512, 2
	return cfg
}

// TestGPTContextParallel: each sequence split over cp in the zigzag layout
// (ring attention over cp, the rest token by token) gives the losses of the
// whole sequence on one rank for 20 steps, on cp=2 and cp=4; cp=2,tp=2 gives
// tp=2's.
func TestGPTContextParallel(t *testing.T) {
	const steps, tol = 20, 1e-4
	for _, tc := range []struct{ ref, mesh string }{{"tp=1", "cp=2"}, {"tp=1", "cp=4"}, {"tp=2", "cp=2,tp=2"}} {
		start := time.Now()
		ref := trainMoE(t, cpGPT(t, tc.ref), steps)
		mid := time.Now()
		got := trainMoE(t, cpGPT(t, tc.mesh), steps)
		worst := sameLosses(t, tc.mesh, got.losses, ref.losses, tol)
		t.Logf("%s against %s: worst relative difference %.2g over %d steps (loss %.4f → %.4f); %s %v, %s %v",
			tc.mesh, tc.ref, worst, steps, ref.losses[0], ref.losses[steps-1],
			tc.ref, mid.Sub(start).Round(time.Millisecond), tc.mesh, time.Since(mid).Round(time.Millisecond))
		if !(ref.losses[steps-1] < ref.losses[0]) {
			t.Errorf("%s: loss does not fall: %v", tc.ref, ref.losses)
		}
	}
}

// TestGPTContextParallelRefused: the settings context parallelism refuses,
// each with one line naming what is wrong.
func TestGPTContextParallelRefused(t *testing.T) {
	for _, tc := range []struct {
		name, mesh string
		edit       func(*models.GPTConfig)
		want       string
	}{
		{"context", "cp=2,tp=2", func(c *models.GPTConfig) { c.Context = 510 }, "context 510 is not a multiple of 2·cp = 4"},
		{"context cp=4", "cp=4", func(c *models.GPTConfig) { c.Context = 20 }, "context 20 is not a multiple of 2·cp = 8"},
		{"sequence parallel", "cp=2,tp=2", func(c *models.GPTConfig) { c.SequenceParallel = true }, "does not combine with sequence parallelism"},
		{"experts", "cp=2,tp=2", func(c *models.GPTConfig) { c.Experts, c.TopK = 2, 1 }, "does not combine with experts"},
		{"mesh order", "tp=2,cp=2", func(*models.GPTConfig) {}, "cp=C,tp=N"},
		{"other dim", "cp=2,ep=2", func(*models.GPTConfig) {}, "dp=D,cp=C"},
	} {
		cfg := cpGPT(t, tc.mesh)
		tc.edit(&cfg)
		_, err := models.PlanGPT(cfg, false)
		if err == nil || !errors.Is(err, linear.ErrConfig) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line naming %q", tc.name, err, tc.want)
		}
	}
	// The parameters are those of the model without cp, replicated over it.
	ps, err := models.PlanGPT(cpGPT(t, "cp=2,tp=2"), true)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := models.PlanGPT(cpGPT(t, "tp=2"), true)
	if len(ps) != len(want) {
		t.Fatalf("cp=2,tp=2 lists %d tensors, tp=2 %d", len(ps), len(want))
	}
	for i, p := range ps {
		if p.Name != want[i].Name || p.Spec.Placements[0] != (placement.Replicate{}) {
			t.Errorf("%s %s, want %s replicated over cp", p.Name, p.Spec, want[i].Name)
		}
	}
}
