// Package stubtest runs package nccl's binding (cgo, -tags cuda) in CI,
// where there is no GPU, no NCCL and no CUDA install: its test TestBinding
// (built without tags) compiles stand-ins for libnccl.so.2 and libcuda.so.1
// (testdata/*.c, with gcc) that record every call and its arguments, builds
// this package's cuda-tagged tests against them, and runs them with the
// stand-ins on the loader's path and MESHRUN_NCCL_LIBRARY naming the NCCL
// one. They go through the real dlopen and dlsym, the enums, the streams,
// the group calls' thread, the asynchronous-error query and the version
// check, with the nccl backend on sim memory (which has a Stream and a
// Run, as the cuda provider's has). The package has no code of its own.
package stubtest
