package placement

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
)

// Bounds on what the package describes and plans. Every Mesh and every valid
// Spec is within them, so their sizes, element counts and byte counts are
// computed without overflow.
const (
	// MaxDevices is the most ranks a mesh may hold.
	MaxDevices = 1 << 16
	// MaxMeshDims is the most dims a mesh may have.
	MaxMeshDims = 8
	// MaxTensorDims is the most dims a spec's tensor may have.
	MaxTensorDims = 16
	// MaxElems is the most elements a tensor (a spec's global shape) may hold,
	// and the longest any of its dims may be: 2^48, as package tensor allows,
	// so that its bytes in any dtype fit an int64 many times over.
	MaxElems = 1 << 48
)

// MulSize returns a*b for sizes a, b >= 0, and false when either is negative
// or the product does not fit an int64. Every product of sizes (elements,
// bytes, ranks, multiply-adds) that may come from a user goes through it.
func MulSize(a, b int64) (int64, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	if a != 0 && b > math.MaxInt64/a {
		return 0, false
	}
	return a * b, true
}

// ShapeElems is the number of elements of shape (1 for a scalar), and false
// when a dim is negative or the product does not fit an int64.
func ShapeElems(shape []int) (int64, bool) {
	n := int64(1)
	for _, d := range shape {
		var ok bool
		if n, ok = MulSize(n, int64(d)); !ok {
			return 0, false
		}
	}
	return n, true
}

// SatAdd is a+b for a, b >= 0, saturating at math.MaxInt64: plan costs sum
// the elements every rank sends, and a strategy's work multiplies letters'
// sizes, which for the largest tensors on the largest meshes exceed an int64;
// beyond it they all compare equal, and they order plans, never print.
func SatAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// SatMul is a*b for a, b >= 0, saturating at math.MaxInt64 like SatAdd.
func SatMul(a, b int64) int64 {
	if p, ok := MulSize(a, b); ok {
		return p
	}
	return math.MaxInt64
}

// Budget is the work planning may still do, shared by every plan made under
// one context (WithBudget): the search for one redistribution, and the rules
// of package spmd that price many. A unit is about one rank visited while
// pricing a step: a step over a mesh of n ranks costs n plus a fixed amount,
// a layout the search looks at costs 1. A Budget also remembers the plans
// made under it: a redistribution planned twice costs once. It may be shared
// by goroutines.
type Budget struct {
	left  atomic.Int64
	total int64
	mu    sync.Mutex
	plans map[string]planned
}

type planned struct {
	steps    []Step
	err      error
	expanded int
	search   *search // a search stopped at a limit, to resume
}

// recall returns the plan made under b for key, if any. A search stopped at
// a limit is handed to one caller only (it is resumed, then remembered
// again).
func (b *Budget) recall(key string) (planned, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p, ok := b.plans[key]
	if ok && p.search != nil {
		delete(b.plans, key)
	}
	return p, ok
}

// remember keeps the plan for key.
func (b *Budget) remember(key string, p planned) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.plans == nil {
		b.plans = map[string]planned{}
	}
	b.plans[key] = p
}

// DefaultBudget is the work a plan (or a whole op of package spmd, or a whole
// MLP block) may do when its context carries no Budget: about a second and
// at most a few tens of MiB allocated. It plans the MLP block on meshes of up
// to five dims (4x4x4x4 in 0.7 s, 2x2x2x2x2 in 2 s on a 2-core machine) or
// of 4096 ranks in two (64x64).
const DefaultBudget = 4 << 20

type budgetKey struct{}

// WithBudget returns a context whose plans share a budget of n units.
func WithBudget(ctx context.Context, n int64) context.Context {
	b := &Budget{total: n}
	b.left.Store(n)
	return context.WithValue(ctx, budgetKey{}, b)
}

// BudgetOf returns ctx's budget and ctx, or, when ctx has none, a fresh
// DefaultBudget and a context that carries it.
func BudgetOf(ctx context.Context) (*Budget, context.Context) {
	if b, ok := ctx.Value(budgetKey{}).(*Budget); ok {
		return b, ctx
	}
	ctx = WithBudget(ctx, DefaultBudget)
	return ctx.Value(budgetKey{}).(*Budget), ctx
}

// Spend takes n units of work. It returns an error wrapping ErrBudget once the
// budget is spent, and ctx's error once ctx is done; what asks the budget to
// spend checks the context at the same time.
func (b *Budget) Spend(ctx context.Context, n int64) error {
	if err := ctx.Err(); err != nil {
		if cause := context.Cause(ctx); cause != err {
			return fmt.Errorf("planning stopped: %w (%w)", cause, err)
		}
		return fmt.Errorf("planning stopped: %w", err)
	}
	if b.left.Add(-n) < 0 {
		return fmt.Errorf("planning needs more than its budget of %d units of work (a mesh of fewer dims or ranks plans within it): %w", b.total, ErrBudget)
	}
	return nil
}

// Left is the work still allowed.
func (b *Budget) Left() int64 { return max(b.left.Load(), 0) }
