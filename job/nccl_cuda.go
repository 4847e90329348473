//go:build cuda

package job

import (
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/nccl"
)

// cudaBackends: CUDA builds carry the nccl collective backend (NCCL loaded
// at run time).
func cudaBackends() []collective.DeviceBackend { return []collective.DeviceBackend{nccl.Backend()} }
