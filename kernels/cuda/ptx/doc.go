// Package ptx holds the cuda provider's CUDA C kernels: their source
// (kernels.h, device.h), the PTX gen.sh compiles from it (kernels.ptx, go
// generate), embedded here as PTX, and their launch shapes. With -tags
// cudaemu it also runs the same source on the CPU, thread by thread (a host
// C++ compiler builds it: every kernel is a grid-stride loop with no barrier
// and no atomic), so that the kernels' arithmetic is tested against the cpu
// provider without a GPU (CI: .ci/checks.d/cuda-kernels.sh). The source is a
// header so that the Go build tracks it for the emulation.
package ptx

import _ "embed" // kernels.ptx

//go:generate ./gen.sh

// PTX is kernels.h compiled by gen.sh (sm_80 PTX: the driver compiles it
// for the GPU it loads on).
//
//go:embed kernels.ptx
var PTX string
