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

var (
	// ErrNoRule: the op is unknown, or no strategy reaches the requested layout.
	ErrNoRule = errors.New("no sharding rule")
	// ErrShape: input shapes that do not fit the op.
	ErrShape = errors.New("shape mismatch")
	// ErrMesh: inputs on different meshes.
	ErrMesh = errors.New("mesh mismatch")
	// ErrGrad: a gradient that cannot be planned (unknown name, or the backward
	// of a P(max) or P(min) tensor, whose gradient depends on the data).
	ErrGrad = errors.New("no gradient rule")
)
