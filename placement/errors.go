// Package placement describes how tensors are laid out on a device mesh and plans
// the collectives that move a tensor from one layout to another.
//
// It is pure: no I/O, no goroutines, no clock. Same input, same output.
//
// A Mesh is an N-D grid of ranks with optional dimension names ("4", "dp=2,tp=2").
// A Spec is a tensor's global shape, a mesh and one Placement per mesh dim:
// Shard (S(d), S(d,chunk)), Replicate (R) or Partial (P, P(avg), P(max), P(min)).
// Plan(from, to) returns the cheapest ordered list of Steps (all-gather,
// reduce-scatter, all-reduce, all-to-all, local slice, owner-rank partial) that
// turns one into the other.
package placement

import "errors"

// Sentinel errors. Errors returned by this package wrap one of these; test with
// errors.Is. A sentinel's message starts with "placement: " and a call site
// wraps it first, adding no prefix of its own: fmt.Errorf("%w: empty mesh", ErrSyntax).
var (
	// ErrSyntax: a mesh, placement or spec string that does not parse.
	ErrSyntax = errors.New("placement: syntax error")
	// ErrInvalid: a mesh, placement or spec that parses but cannot hold (a shard
	// of a dim the tensor lacks, a placement count that differs from the mesh).
	// It is not collective.ErrInvalid (bad arguments to a running collective)
	// nor launch.ErrInvalid (options a launcher cannot run): a layout is
	// refused before anything runs, and callers tell the three apart.
	ErrInvalid = errors.New("placement: invalid")
	// ErrWorldSize: a mesh whose size differs from the number of ranks.
	ErrWorldSize = errors.New("placement: mesh does not match world size")
	// ErrNoPath: no sequence of collectives reaches the target (S -> P, or a
	// change of the partial reduction).
	ErrNoPath = errors.New("placement: no redistribution path")
	// ErrTooLarge: a mesh, shape or size beyond the package's bounds
	// (MaxDevices, MaxMeshDims, MaxElems) or whose product overflows.
	ErrTooLarge = errors.New("placement: too large")
	// ErrBudget: planning that would take more work than its Budget allows.
	ErrBudget = errors.New("placement: planning budget exceeded")
)
