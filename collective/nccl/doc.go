// Package nccl loads NCCL (libnccl.so.2) at run time and gives the nccl
// collective backend for CUDA tensors (Backend, over collective.NCCLBackend)
// to the Worlds whose Options.Backends list it; it is built with -tags cuda.
// Building needs no NCCL or CUDA headers: the handful of types and enums of
// NCCL's stable C API the backend calls, and the driver's cuStreamQuery, are
// declared here (it links -lcuda); package stubtest runs it against
// stand-in libraries without a GPU. A binary run where the
// library is missing still runs: under MESHRUN_COLLECTIVES=auto, CUDA
// buffers then take the staged backend, and the log line choosing it says
// why.
//
// The library is looked for at the path Backend and Open are given (the
// worker passes MESHRUN_NCCL_LIBRARY's value, read where it starts: package
// job), else as libnccl.so.2 on the loader's path. PyTorch's wheels carry one under
// site-packages/nvidia/nccl/lib.
package nccl
