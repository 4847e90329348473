package tensor

import "errors"

// Sentinel errors. Functions wrap them with context (%w); test with errors.Is.
// A sentinel's message starts with its package's name ("tensor: ") and a call
// site wraps it first, adding no prefix of its own: fmt.Errorf("%w: ...", ErrShape).
// kernels.ErrShape, ErrDType and ErrDevice are these same values.
var (
	// ErrShape reports a shape that is invalid or does not match the data.
	ErrShape = errors.New("tensor: bad shape")
	// ErrDType reports an unsupported or mismatched element type.
	ErrDType = errors.New("tensor: bad dtype")
	// ErrDevice reports an operation that needs host memory on a device tensor, or the reverse.
	ErrDevice = errors.New("tensor: wrong device")
	// ErrFormat reports a malformed .npy stream.
	ErrFormat = errors.New("tensor: bad npy format")
)
