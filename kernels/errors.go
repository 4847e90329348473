package kernels

import (
	"errors"

	"github.com/meshrun/meshrun/tensor"
)

// Sentinel errors; calls wrap them with the op and shapes (%w), test with
// errors.Is. A sentinel's message starts with its package's name ("kernels: "
// here) and a call site wraps it first, adding no prefix of its own:
// fmt.Errorf("%w: gemm %v x %v", ErrShape, a, b).
var (
	// ErrShape reports operands whose shapes or leading dims do not fit the
	// op. It is tensor.ErrShape: an operand that does not fit is the same
	// error whether a tensor or a kernel finds it, so errors.Is matches
	// either name ("tensor: bad shape").
	ErrShape = tensor.ErrShape
	// ErrDType reports an unsupported or mixed element type. It is
	// tensor.ErrDType ("tensor: bad dtype"), for the same reason.
	ErrDType = tensor.ErrDType
	// ErrDevice reports operands on a device the provider does not run on.
	// It is tensor.ErrDevice ("tensor: wrong device"), for the same reason.
	ErrDevice = tensor.ErrDevice
	// ErrUnknownProvider reports a provider name that is not registered.
	ErrUnknownProvider = errors.New("kernels: unknown provider")
	// ErrUnknownOp reports an op name that does not exist.
	ErrUnknownOp = errors.New("kernels: unknown op")
	// ErrUnsupported reports an op that a provider does not implement.
	ErrUnsupported = errors.New("kernels: op not implemented by provider")
	// ErrNoProvider reports a call on a device for which the dispatcher holds no provider.
	ErrNoProvider = errors.New("kernels: no provider for device")
)
