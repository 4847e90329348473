package placement_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	. "github.com/meshrun/meshrun/placement"
)

func TestMulSize(t *testing.T) {
	for _, tc := range []struct {
		a, b, want int64
		ok         bool
	}{
		{0, math.MaxInt64, 0, true},
		{3, 4, 12, true},
		{1 << 31, 1 << 31, 1 << 62, true},
		{1 << 32, 1 << 31, 0, false},
		{math.MaxInt64, 2, 0, false},
		{-1, 2, 0, false},
		{2, -1, 0, false},
		{3_000_000_000, 1_000_000_000, 3_000_000_000_000_000_000, true},
		{4_000_000_000, 4_000_000_000, 0, false},
	} {
		if got, ok := MulSize(tc.a, tc.b); got != tc.want || ok != tc.ok {
			t.Errorf("MulSize(%d, %d) = %d, %v; want %d, %v", tc.a, tc.b, got, ok, tc.want, tc.ok)
		}
	}
	if n, ok := ShapeElems([]int{1 << 40, 1 << 30}); ok {
		t.Errorf("ShapeElems(2^40 x 2^30) = %d, want an overflow", n)
	}
	if n, ok := ShapeElems([]int{0, math.MaxInt}); !ok || n != 0 {
		t.Errorf("ShapeElems(0 x max) = %d, %v", n, ok)
	}
}

// TestTooLarge: meshes and shapes beyond the bounds are refused at once with
// ErrTooLarge and a message naming them, never a panic, an overflow or an
// allocation of their size.
func TestTooLarge(t *testing.T) {
	for _, tc := range []struct{ mesh, want string }{
		{"1000000x1000000", "size 1000000 is more than 65536"},
		{"4096x4096", "mesh 4096x4096 holds more than 65536 devices"},
		{"256x257", "mesh 256x257 holds more than 65536 devices"},
		{"dp=65536,tp=2", "holds more than 65536 devices"},
		{"99999999999999999999999", "is more than 65536"},
		{"1x1x1x1x1x1x1x1x1", "has 9 dims, more than the 8"},
	} {
		start := time.Now()
		_, err := ParseMesh(tc.mesh)
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseMesh(%q) = %v, want ErrTooLarge with %q", tc.mesh, err, tc.want)
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Errorf("ParseMesh(%q) took %v", tc.mesh, d)
		}
	}
	for _, mesh := range []string{"65536", "256x256", "tp=8,dp=8192", "1x1x1x1x1x1x1x1"} {
		if _, err := ParseMesh(mesh); err != nil {
			t.Errorf("ParseMesh(%q): %v", mesh, err)
		}
	}
	m := MustMesh([]int{2}, nil)
	for _, tc := range []struct{ spec, want string }{
		{"16777216x16777216x2:[R]", "shape 16777216x16777216x2 holds more than 281474976710656 elements"},
		{"3000000000x1000000000:[S(0)]", "holds more than"},
		{"0x281474976710657:[R]", "size 281474976710657 is more than 281474976710656"},
		{"1x1x1x1x1x1x1x1x1x1x1x1x1x1x1x1x1:[R]", "has 17 dims, more than the 16"},
		{"99999999999999999999999x2:[R]", "is more than 281474976710656"},
	} {
		_, err := ParseSpec(tc.spec, m)
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseSpec(%q) = %v, want ErrTooLarge with %q", tc.spec, err, tc.want)
		}
	}
	if _, err := NewSpec([]int{0, math.MaxInt}, m, Replicate{}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("NewSpec(0 x max): %v", err)
	}
	for _, spec := range []string{"16777216x16777216:[S(0)]", "0x281474976710656:[S(1)]"} {
		if _, err := ParseSpec(spec, m); err != nil {
			t.Errorf("ParseSpec(%q): %v", spec, err)
		}
	}
}

// TestShardRangeAnySize: no length, however large, overflows a shard's offset.
func TestShardRangeAnySize(t *testing.T) {
	for _, n := range []int{0, 1, 7, MaxElems, math.MaxInt64 - 1, math.MaxInt64} {
		for _, p := range []int{1, 3, MaxDevices} {
			for _, split := range []Split{Balanced, Chunk} {
				for _, r := range []int{0, 1, p / 2, p - 2, p - 1} {
					if r < 0 || r >= p {
						continue
					}
					off, size := ShardRange(n, p, r, split)
					if off < 0 || size < 0 || off > n || size > n-off {
						t.Fatalf("ShardRange(%d, %d, %d, %v) = %d, %d", n, p, r, split, off, size)
					}
					if r == p-1 && off+size != n {
						t.Fatalf("ShardRange(%d, %d, %d, %v): last piece ends at %d", n, p, r, split, off+size)
					}
				}
			}
		}
	}
}

// TestCostSaturates: the largest tensor all-reduced over the largest mesh sends
// more elements than an int64 holds; the cost saturates, never goes negative.
func TestCostSaturates(t *testing.T) {
	m := MustMesh([]int{MaxDevices}, nil)
	from := MustSpec([]int{1 << 24, 1 << 24}, m, Partial{})
	to := MustSpec([]int{1 << 24, 1 << 24}, m, Replicate{})
	steps, err := Plan(from, to)
	if err != nil {
		t.Fatal(err)
	}
	if c := PlanCost(steps); c != math.MaxInt64 {
		t.Fatalf("cost %d, want it saturated", c)
	}
	if n := steps[0].SendElems(0); n <= 0 || n > 2<<48 {
		t.Fatalf("rank 0 sends %d", n)
	}
}

// TestPlanBudget: a search that needs more work than its planner's budget
// ends with ErrBudget, and one whose context is done with the context's
// error; a plan asked twice of one planner costs once.
func TestPlanBudget(t *testing.T) {
	m := MustMesh([]int{2, 2, 2, 2, 2, 2}, nil)
	from := mustSpec(t, []int{8, 16}, m, "[S(0),S(1),P,R,R,R]")
	to := mustSpec(t, []int{8, 16}, m, "[S(1),R,S(0),S(1),R,P]")
	_, err := NewPlanner(DefaultModel, 1000).Plan(context.Background(), from, to)
	if !errors.Is(err, ErrBudget) || !strings.Contains(err.Error(), "budget of 1000 units") {
		t.Fatalf("small budget: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := DefaultPlanner().Plan(ctx, from, to); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
	p := DefaultPlanner()
	first, err := p.Plan(context.Background(), from, to)
	if err != nil {
		t.Fatal(err)
	}
	left := p.Left()
	again, err := p.Plan(context.Background(), from, to)
	if err != nil || planString(again) != planString(first) || p.Left() != left {
		t.Fatalf("second plan: %v, %s (first %s), budget %d -> %d", err, planString(again), planString(first), left, p.Left())
	}
}
