package models_test

import (
	"math"
	"testing"

	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/placement"
)

// trainMLP trains the block on mesh for steps steps (trainSteps).
func trainMLP(t *testing.T, mesh string, sp bool, steps int) trainRun {
	m, err := placement.ParseMesh(mesh)
	if err != nil {
		t.Fatal(err)
	}
	cfg := models.MLPConfig{Mesh: m, Tokens: 12, Hidden: 8, FFN: 24, SequenceParallel: sp, Seed: 5, LR: 0.05}
	return trainSteps(t, m, steps, func(rank int) (stepper, error) {
		b, err := models.NewMLP(cfg, rank, nil)
		if err != nil {
			return nil, err
		}
		return b.Step, nil
	})
}

// TestMLPMatchesSingleRank trains the block sharded and on one rank: the same
// losses within 1e-5 relative, and Megatron's collective counts.
func TestMLPMatchesSingleRank(t *testing.T) {
	ref := trainMLP(t, "1", false, 4)
	if !(ref.losses[3] < ref.losses[0]) {
		t.Fatalf("loss does not fall: %v", ref.losses)
	}
	for _, tc := range []struct {
		mesh  string
		sp    bool
		comms map[string]int
	}{
		{"tp=2", false, map[string]int{"all_reduce y": 1, "all_reduce dx": 1, "all_reduce loss": 0}},
		{"tp=3", false, map[string]int{"all_reduce y": 1, "all_reduce dx": 1}},
		{"tp=4", true, map[string]int{"all_gather x": 1, "reduce_scatter y": 1, "all_gather dy": 1, "reduce_scatter dx": 1, "all_reduce loss": 1}},
		{"dp=2,tp=2", false, nil},
		{"dp=2,tp=2", true, nil},
	} {
		name := tc.mesh
		if tc.sp {
			name += "/sequence-parallel"
		}
		t.Run(name, func(t *testing.T) {
			got := trainMLP(t, tc.mesh, tc.sp, 4)
			for i := range ref.losses {
				if d := math.Abs(got.losses[i]-ref.losses[i]) / ref.losses[i]; d > 1e-5 {
					t.Fatalf("step %d: loss %.9g, single rank %.9g (relative %.2g)", i, got.losses[i], ref.losses[i], d)
				}
			}
			total := 0
			for k, n := range tc.comms {
				total += n
				if got.comms[k] != n {
					t.Errorf("%s: %d, want %d (all: %v)", k, got.comms[k], n, got.comms)
				}
			}
			if tc.comms != nil {
				n := 0
				for _, c := range got.comms {
					n += c
				}
				if n != total {
					t.Errorf("collectives %v, want only %v", got.comms, tc.comms)
				}
			}
		})
	}
}
