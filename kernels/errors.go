package kernels

import "errors"

// Sentinel errors; calls wrap them with the op and shapes (%w), test with errors.Is.
var (
	// ErrShape reports operands whose shapes or leading dims do not fit the op.
	ErrShape = errors.New("kernels: shape mismatch")
	// ErrDType reports an unsupported or mixed element type.
	ErrDType = errors.New("kernels: unsupported dtype")
	// ErrDevice reports operands on a device the provider does not run on.
	ErrDevice = errors.New("kernels: wrong device")
	// ErrUnknownProvider reports a provider name that is not registered.
	ErrUnknownProvider = errors.New("kernels: unknown provider")
	// ErrUnknownOp reports an op name that does not exist.
	ErrUnknownOp = errors.New("kernels: unknown op")
	// ErrUnsupported reports an op that a provider does not implement.
	ErrUnsupported = errors.New("kernels: op not implemented by provider")
	// ErrNoProvider reports a call on a device for which the dispatcher holds no provider.
	ErrNoProvider = errors.New("kernels: no provider for device")
)
