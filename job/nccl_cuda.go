//go:build cuda

package job

// CUDA builds carry the nccl collective backend (NCCL loaded at run time).
import _ "github.com/meshrun/meshrun/collective/nccl"
