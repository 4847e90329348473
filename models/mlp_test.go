package models_test

import (
	"context"
	"math"
	"sync"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/job"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/redistribute"
)

// countComms records into comms, by "kind tensor", the collectives that
// move bytes (under mu: ranks run concurrently).
func countComms(mu *sync.Mutex, comms map[string]int) func(string, redistribute.Executed) {
	return func(name string, ex redistribute.Executed) {
		if len(ex.Group) > 1 && ex.Kind.Moves() {
			mu.Lock()
			comms[ex.Kind.String()+" "+name]++
			mu.Unlock()
		}
	}
}

// trainRun is what a training test keeps: rank 0's losses, and the
// collectives of its last step by "kind tensor" (countComms).
type trainRun struct {
	losses []float64
	comms  map[string]int
}

// stepper is one rank's model: it takes a step and returns the loss.
type stepper func(ctx context.Context, rt linear.Runtime) (float64, error)

// trainSteps runs steps steps on the ranks of mesh m in one process (cpu
// kernels); newStep builds each rank's model.
func trainSteps(t *testing.T, m placement.Mesh, steps int, newStep func(rank int) (stepper, error)) trainRun {
	t.Helper()
	k, err := providers.New("cpu", nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	run := trainRun{comms: map[string]int{}}
	err = job.InProcess(context.Background(), m.Size(), func(ctx context.Context, w *collective.World) error {
		step, err := newStep(w.Rank())
		if err != nil {
			return err
		}
		rt := linear.Runtime{World: w, Kernels: k}
		for s := 0; s < steps; s++ {
			if w.Rank() == 0 && s == steps-1 {
				rt.Record = countComms(&mu, run.comms)
			}
			loss, err := step(ctx, rt)
			if err != nil {
				return err
			}
			if w.Rank() == 0 {
				mu.Lock()
				run.losses = append(run.losses, loss)
				mu.Unlock()
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return run
}

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
