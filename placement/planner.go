package placement

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// Planner is the state planning draws on, handed to every planning function:
// the cost model that prices plans, the work planning may still do (its
// budget), and the plans made so far (its cache), so that a plan asked for
// again is not searched again: a redistribution planned twice costs once, and
// package spmd remembers each op's plan in it, so a model's repeated layers
// are planned once. The planners WithModel and WithBudget derive from a
// Planner share its cache (WithModel its budget too): what one planned, the
// others find. A Planner may be shared by goroutines.
type Planner struct {
	model  Model
	budget *budget
	cache  *cache
}

// budget is the work planning may still do. A unit is about one rank visited
// while pricing a step: a step over a mesh of n ranks costs n plus a fixed
// amount, a layout the search looks at costs 1.
type budget struct {
	left  atomic.Int64
	total int64
}

// cache holds what the planners sharing it planned, by a key that begins
// with the planning package's name: the redistributions package placement
// searched (planned), and what package spmd remembers (Remember).
type cache struct {
	mu      sync.Mutex
	entries map[string]any
}

// maxCached bounds the entries of a cache; a full cache starts over (what it
// forgets is planned again, the same way).
const maxCached = 1 << 16

// DefaultBudget is the work a planner does at most unless given another
// budget: about a second and at most a few tens of MiB allocated. It plans the
// MLP block on meshes of up to five dims (4x4x4x4 in 0.7 s, 2x2x2x2x2 in 2 s
// on a 2-core machine) or of 4096 ranks in two (64x64).
const DefaultBudget = 4 << 20

// NewPlanner returns a planner that prices plans by m and may do n units of
// work, its cache empty.
func NewPlanner(m Model, n int64) *Planner {
	return &Planner{model: m, budget: newBudget(n), cache: &cache{}}
}

// DefaultPlanner is NewPlanner(DefaultModel, DefaultBudget): what the
// planning functions given a nil Planner plan with.
func DefaultPlanner() *Planner { return NewPlanner(DefaultModel, DefaultBudget) }

func newBudget(n int64) *budget {
	b := &budget{total: n}
	b.left.Store(n)
	return b
}

// orDefault is p, or a DefaultPlanner where p is nil.
func (p *Planner) orDefault() *Planner {
	if p == nil {
		return DefaultPlanner()
	}
	return p
}

// Model is the model p prices plans by (a nil p's: DefaultModel).
func (p *Planner) Model() Model { return p.orDefault().model }

// WithModel is a planner that prices plans by m, with p's budget and cache
// (the cache tells plans under different models apart). A nil p is a
// DefaultPlanner, here and in WithBudget.
func (p *Planner) WithModel(m Model) *Planner {
	q := *p.orDefault()
	q.model = m
	return &q
}

// WithBudget is a planner that may do n units of work, with p's model and
// cache: a caller that plans many independent problems gives each a budget
// of its own and still plans a repeated one once.
func (p *Planner) WithBudget(n int64) *Planner {
	q := *p.orDefault()
	q.budget = newBudget(n)
	return &q
}

// Spend takes n units of work from p's budget. It returns an error wrapping
// ErrBudget once the budget is spent, and ctx's error once ctx is done; what
// asks the budget to spend checks the context at the same time.
func (p *Planner) Spend(ctx context.Context, n int64) error {
	if err := ctx.Err(); err != nil {
		if cause := context.Cause(ctx); cause != err {
			return fmt.Errorf("planning stopped: %w (%w)", cause, err)
		}
		return fmt.Errorf("planning stopped: %w", err)
	}
	if p.budget.left.Add(-n) < 0 {
		return fmt.Errorf("%w: planning needs more than its budget of %d units of work (a mesh of fewer dims or ranks plans within it)",
			ErrBudget, p.budget.total)
	}
	return nil
}

// Left is the work p may still do.
func (p *Planner) Left() int64 { return max(p.budget.left.Load(), 0) }

// Recall returns what was remembered under key by a planner sharing p's
// cache. Keys begin with the name of the package that remembers: "spmd|...".
func (p *Planner) Recall(key string) (any, bool) {
	c := p.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.entries[key]
	return v, ok
}

// Remember keeps v under key in p's cache (see Recall). What is remembered
// is shared by every caller of the cache, and must not change after.
func (p *Planner) Remember(key string, v any) {
	c := p.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries) >= maxCached {
		c.entries = map[string]any{}
	}
	c.entries[key] = v
}

// planned is a redistribution searched under a planner.
type planned struct {
	steps    []Step
	err      error
	expanded int
	search   *search // a search stopped at a limit, to resume
}

// recallPlanned returns the redistribution planned under key, if any. A
// search stopped at a limit is handed to one caller only (it is resumed,
// then remembered again).
func (p *Planner) recallPlanned(key string) (planned, bool) {
	c := p.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.entries[key].(planned)
	if ok && v.search != nil {
		delete(c.entries, key)
	}
	return v, ok
}
