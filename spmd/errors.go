// Package spmd holds the sharding rules: given how an op's inputs are placed on a
// mesh, it decides how the local op runs, how its output is placed and which
// collectives move data, forward and backward.
//
// Every rule comes from one einsum engine: an op is an einsum equation
// ("...k,nk->...n" for linear with PyTorch's weight layout) plus what the op is
// linear in. The engine enumerates, for each mesh dim, every way to split the
// work (replicate, shard an output letter, shard a contracted letter and leave a
// partial sum, pass a partial input through a linear op), prices each strategy by
// the elements every redistribution moves, the consumer's requested output
// placement included, and picks the cheapest; ties go to fewer steps, then to
// the first strategy in a fixed order. Backward rules are derived from the
// gradient einsums of the forward equation and planned the same way.
//
// The package is pure: no I/O, no goroutines, no clock.
package spmd

import "errors"

// Sentinel errors; test with errors.Is. A sentinel's message starts with
// "spmd: " and a call site wraps it first, adding no prefix of its own:
// fmt.Errorf("%w: op %q", ErrNoRule, op).
var (
	// ErrNoRule: the op is unknown, or no strategy reaches the requested layout.
	ErrNoRule = errors.New("spmd: no sharding rule")
	// ErrShape: input shapes that do not fit the op. It is not tensor.ErrShape
	// (kernels.ErrShape): this one refuses a planned op's global shapes, from
	// specs, before any tensor exists (a plan or a check of the options that
	// fails), that one an operand a kernel or a tensor was handed at run time.
	ErrShape = errors.New("spmd: shape mismatch")
	// ErrMesh: inputs on different meshes.
	ErrMesh = errors.New("spmd: mesh mismatch")
	// ErrGrad: a gradient that cannot be planned (unknown name, or the backward
	// of a P(max) or P(min) tensor, whose gradient depends on the data).
	ErrGrad = errors.New("spmd: no gradient rule")
)
