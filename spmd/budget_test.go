package spmd

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/placement"
)

func linearRequest(t testing.TB, mesh, x, w string) Request {
	t.Helper()
	m, err := placement.ParseMesh(mesh)
	if err != nil {
		t.Fatal(err)
	}
	var in []Operand
	for _, s := range []string{x, w} {
		sp, err := placement.ParseSpec(s, m)
		if err != nil {
			t.Fatal(err)
		}
		in = append(in, Operand{Spec: sp})
	}
	return Request{Op: "linear_nobias", Inputs: in}
}

// TestBudget: an op that cannot be planned within the planner's budget is
// refused in well under a second; a plan whose context is done stops with
// the context's error.
func TestBudget(t *testing.T) {
	ctx := context.Background()
	pl := placement.DefaultPlanner()
	req := linearRequest(t, "2x2x2x2x2x2", "8x16:[R,R,R,R,R,R]", "32x16:[R,R,R,R,R,S(0)]")
	start := time.Now()
	_, err := ForwardWith(ctx, pl.WithBudget(100), req)
	if !errors.Is(err, placement.ErrBudget) || !strings.Contains(err.Error(), "planning needs more than") {
		t.Fatalf("6-D mesh, small budget: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refusing took %v", d)
	}
	if _, err := ForwardWith(ctx, pl, req); err != nil {
		t.Fatalf("6-D mesh, default budget: %v", err)
	}
	// Planned once, the op is remembered: planning it again with the same
	// cache costs no work, but a spent budget still refuses it.
	if _, err := ForwardWith(ctx, pl.WithBudget(100), req); err != nil {
		t.Fatalf("6-D mesh, remembered, small budget: %v", err)
	}
	if _, err := ForwardWith(ctx, pl.WithBudget(-1), req); !errors.Is(err, placement.ErrBudget) {
		t.Fatalf("6-D mesh, remembered, spent budget: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ForwardWith(ctx, nil, linearRequest(t, "dp=2,tp=2", "8x16:[S(0),R]", "32x16:[R,S(0)]")); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
}

// TestHugeSizes: the bytes of a plan over the largest tensors are counted
// without overflow.
func TestHugeSizes(t *testing.T) {
	fwd, err := Forward(linearRequest(t, "tp=2", "16777216x16777216:[S(1)]", "16777216x16777216:[S(1)]"))
	if err != nil {
		t.Fatal(err)
	}
	bwd, err := BackwardOf(fwd, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if fwd.Cost <= 0 || fwd.CommElems() <= 0 || bwd.CommElems() < 0 {
		t.Fatalf("cost %d, elements %d forward, %d backward", fwd.Cost, fwd.CommElems(), bwd.CommElems())
	}
	text := Text(fwd, bwd, 8)
	if regexp.MustCompile(`-[0-9]`).MatchString(text) {
		t.Fatalf("negative count:\n%s", text)
	}
}
