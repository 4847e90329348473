//go:build cuda

package job

import (
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/nccl"
)

// cudaBackends: CUDA builds carry the nccl collective backend (NCCL loaded
// at run time from library, MESHRUN_NCCL_LIBRARY's value: "" is libnccl.so.2).
func cudaBackends(library string) []collective.DeviceBackend {
	return []collective.DeviceBackend{nccl.Backend(library)}
}
