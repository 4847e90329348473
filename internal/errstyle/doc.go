// Package errstyle holds the tests of the module's error style, and no code.
//
// Every exported sentinel error (var ErrX = errors.New(...)) reads
// "PKG: what", PKG being its package's name; a call site wraps it first and
// adds no prefix of its own, fmt.Errorf("%w: detail", ErrX, ...), so a
// message names its package once: "placement: syntax error: empty mesh". A
// sentinel that means what another package's does is that one, re-exported
// (var ErrShape = tensor.ErrShape) with a doc comment naming it.
// TestSentinelStyle checks the rule over the module's source,
// TestSentinelMessages over errors the packages return.
package errstyle
