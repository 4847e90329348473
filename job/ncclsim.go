package job

import (
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/ncclfake"
	"github.com/meshrun/meshrun/kernels/sim"
	"github.com/meshrun/meshrun/tensor"
)

// collectiveBackends lists the device backends of this worker's Worlds
// (collective.Options.Backends), their settings read from getenv: the nccl
// backend for CUDA tensors in cuda builds (cudaBackends, over the library
// MESHRUN_NCCL_LIBRARY names), and the fake library's when chosen.
//
// With MESHRUN_NCCL_LIBRARY=fake, sim devices have the nccl backend over the
// fake library (package ncclfake): a job on --device sim then runs the CUDA
// path's collective coordination (unique id over NATS, communicators,
// grouped sends and receives, abort, each call in the device's context)
// without a GPU. Ranks in separate processes are on separate sim devices;
// in-process ranks share one, as in-process GPU ranks share a GPU, and take
// staged collectives under auto.
func collectiveBackends(getenv func(string) string) []collective.DeviceBackend {
	library := getenv(collective.EnvNCCLLibrary)
	bs := cudaBackends(library)
	if library == "fake" {
		bs = append(bs, ncclfake.Backend(tensor.Sim, ncclfake.Options{Resolve: sim.Resolve, Current: sim.Current}))
	}
	return bs
}
