// Package cudadriver asks the NVIDIA driver how many GPUs this process sees,
// loading libcuda.so.1 with dlopen when asked instead of linking it: a
// program that uses it starts on a machine without the driver, and says so
// only when it needs a GPU. The launcher of a cuda build counts its GPUs
// with it (gorgonia.org/cu, which kernels/cuda uses, links libcuda and exits
// in its package init where cuInit fails).
package cudadriver

import (
	"errors"
	"fmt"
)

// Library is the driver's soname: the name the loader searches for, as it
// does for a binary linked against libcuda.
const Library = "libcuda.so.1"

// ErrNoDriver is the error when the driver library cannot be loaded.
var ErrNoDriver = errors.New("cudadriver: no NVIDIA driver on this machine")

// errNoDevice is CUDA_ERROR_NO_DEVICE: the driver loaded and sees no GPU
// (none installed, or CUDA_VISIBLE_DEVICES hides them).
const errNoDevice = 100

// Count loads the driver (Library when lib is empty, else the file or soname
// lib), initializes it and returns the number of devices it reports; 0 when
// cuInit says there is no device. A driver that cannot be loaded is an error
// wrapping ErrNoDriver and naming the loader's reason, e.g.
// "cudadriver: no NVIDIA driver on this machine: libcuda.so.1: cannot open
// shared object file: No such file or directory".
func Count(lib string) (int, error) {
	if lib == "" {
		lib = Library
	}
	return count(lib)
}

// cuError is an error code of the driver API, with its name when the driver
// gives one.
type cuError struct {
	call string
	code int
	name string
}

func (e *cuError) Error() string {
	if e.name != "" {
		return fmt.Sprintf("%s: %s (%d)", e.call, e.name, e.code)
	}
	return fmt.Sprintf("%s: CUDA error %d", e.call, e.code)
}
