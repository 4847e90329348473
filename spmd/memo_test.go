package spmd

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd/spmdtest"
)

// TestMemo: an op planned again by a planner sharing the first's cache
// returns an equal plan for no work; what the caller changes in it does not
// reach the next caller; a different model, output placement or explain
// count plans afresh.
func TestMemo(t *testing.T) {
	ctx := context.Background()
	pl := placement.DefaultPlanner()
	req := linearRequest(t, "a=2,b=2,c=2", "16x8x32:[S(0),S(1),R]", "64x32:[R,R,S(0)]")
	first, err := ForwardWith(ctx, pl, req)
	if err != nil {
		t.Fatal(err)
	}
	b := pl.WithBudget(placement.DefaultBudget)
	again, err := ForwardWith(ctx, b, req)
	if err != nil {
		t.Fatal(err)
	}
	if b.Left() != placement.DefaultBudget {
		t.Errorf("a remembered plan cost %d units of work", placement.DefaultBudget-b.Left())
	}
	if !reflect.DeepEqual(first, again) {
		t.Fatalf("remembered plan differs:\n%+v\n%+v", first, again)
	}
	again.Strategy[0] = "changed"
	again.Local[0].Name = "changed"
	again.Moves = nil
	third, err := ForwardWith(ctx, pl, req)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(first, third) {
		t.Fatalf("a caller's change reached the memo:\n%+v\n%+v", first, third)
	}
	bwd1, err := BackwardOfWith(ctx, pl, first, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	bwd2, err := BackwardOfWith(ctx, pl, third, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(bwd1, bwd2) {
		t.Fatal("remembered backward plans differ")
	}

	// The key: the model (tiny layers where Megatron's layout wins only
	// under LargeLayers), the output placement and the explain count.
	small := linearRequest(t, "dp=2,tp=2", "64x16:[S(0),R]", "32x16:[R,S(0)]")
	def, err := ForwardWith(ctx, pl, small)
	if err != nil {
		t.Fatal(err)
	}
	large, err := ForwardWith(ctx, pl.WithModel(spmdtest.LargeLayers), small)
	if err != nil {
		t.Fatal(err)
	}
	if large.Model == def.Model {
		t.Fatal("a plan under another model came from the memo")
	}
	small.Explain = 2
	explained, err := ForwardWith(ctx, pl, small)
	if err != nil {
		t.Fatal(err)
	}
	if explained.Chosen == nil || def.Chosen != nil {
		t.Fatalf("explain count not in the key: chosen %v, before %v", explained.Chosen, def.Chosen)
	}
	small.Explain = 0
	small.Out, _ = placement.ParseList("[R,R]")
	out, err := ForwardWith(ctx, pl, small)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(out.Final.Spec.Placements, small.Out) {
		t.Fatalf("output placement not in the key: %v", out.Final.Spec)
	}
}

// TestMemoShared: goroutines planning ops forward and backward with one
// planner get the plans each would get alone.
func TestMemoShared(t *testing.T) {
	ctx := context.Background()
	reqs := []Request{
		linearRequest(t, "a=2,b=2,c=2", "16x8x32:[S(0),S(1),R]", "64x32:[R,R,S(0)]"),
		linearRequest(t, "dp=2,tp=2", "64x16:[S(0),R]", "32x16:[R,S(0)]"),
		linearRequest(t, "dp=2,tp=2", "64x16:[R,S(1)]", "32x16:[S(0),R]"),
	}
	var want []string
	for _, req := range reqs {
		fwd, err := Forward(req)
		if err != nil {
			t.Fatal(err)
		}
		bwd, err := BackwardOf(fwd, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, Text(fwd, bwd, 4))
	}
	pl := placement.DefaultPlanner()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 6 {
		wg.Go(func() {
			for k := range reqs {
				i := (g + k) % len(reqs)
				fwd, err := ForwardWith(ctx, pl.WithBudget(placement.DefaultBudget), reqs[i])
				if err != nil {
					errs <- err
					return
				}
				bwd, err := BackwardOfWith(ctx, pl.WithBudget(placement.DefaultBudget), fwd, nil, nil)
				if err != nil {
					errs <- err
					return
				}
				if got := Text(fwd, bwd, 4); got != want[i] {
					errs <- fmt.Errorf("request %d planned with a shared planner:\n%s\nalone:\n%s", i, got, want[i])
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
