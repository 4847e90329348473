//go:build cuda

package launch

import "gorgonia.org/cu"

// gpuCount is the number of CUDA devices this process sees.
func gpuCount() (int, error) { return cu.NumDevices() }
