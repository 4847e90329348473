package placement_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	. "github.com/meshrun/meshrun/placement"
)

// TestPlannerShared: goroutines planning with one planner, and with the
// planners WithModel and WithBudget derive from it, get the plans a planner
// of their own makes; a plan made under one model is not handed out under
// another; a planner derived WithBudget spends its own budget only.
func TestPlannerShared(t *testing.T) {
	m := MustMesh([]int{2, 2, 2}, nil)
	cheapCalls := DefaultModel
	cheapCalls.Name, cheapCalls.Gamma = "cheap calls", 0
	type problem struct{ from, to Spec }
	var problems []problem
	for _, p := range [][2]string{
		{"[S(0),S(1),P]", "[S(1),R,S(0)]"},
		{"[P,P,R]", "[R,R,R]"},
		{"[S(0),R,S(1)]", "[S(1),S(0),R]"},
		{"[R,P,S(0)]", "[S(0),S(0),R]"},
	} {
		problems = append(problems, problem{mustSpec(t, []int{8, 16}, m, p[0]), mustSpec(t, []int{8, 16}, m, p[1])})
	}
	ctx := context.Background()
	want := map[Model][]string{}
	for _, model := range []Model{DefaultModel, cheapCalls} {
		for _, p := range problems {
			steps, err := NewPlanner(model, DefaultBudget).Plan(ctx, p.from, p.to)
			if err != nil {
				t.Fatal(err)
			}
			want[model] = append(want[model], planString(steps))
		}
	}
	if slices.Equal(want[DefaultModel], want[cheapCalls]) {
		t.Fatalf("the models plan alike: %q", want[DefaultModel])
	}
	shared := DefaultPlanner()
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := range 8 {
		wg.Go(func() {
			pl := shared
			if g%2 == 1 {
				pl = shared.WithModel(cheapCalls)
			}
			if g%4 >= 2 {
				pl = pl.WithBudget(DefaultBudget)
			}
			for range 3 {
				for i, p := range problems {
					steps, err := pl.Plan(ctx, p.from, p.to)
					if err != nil {
						errs <- err.Error()
						return
					}
					if got := planString(steps); got != want[pl.Model()][i] {
						errs <- "under " + pl.Model().Name + ": " + got + ", want " + want[pl.Model()][i]
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	fresh := shared.WithBudget(DefaultBudget)
	for _, p := range problems {
		if _, err := fresh.Plan(ctx, p.from, p.to); err != nil {
			t.Fatal(err)
		}
	}
	if fresh.Left() != DefaultBudget {
		t.Errorf("plans in the shared cache cost %d units of work", DefaultBudget-fresh.Left())
	}
}
