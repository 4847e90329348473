package models_test

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
