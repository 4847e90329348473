//go:build !cuda

package job

import "github.com/meshrun/meshrun/collective"

// cudaBackends: builds without cuda have no CUDA tensors to give NCCL.
func cudaBackends(string) []collective.DeviceBackend { return nil }
