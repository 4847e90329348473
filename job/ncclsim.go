package job

import (
	"os"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels/sim"
	"github.com/meshrun/meshrun/tensor"
)

// With MESHRUN_NCCL_LIBRARY=fake, sim devices have the nccl backend over the
// fake library (collective.FakeNCCL): a job on --device sim then runs the
// CUDA path's collective coordination (unique id over NATS, communicators,
// grouped sends and receives, abort, each call in the device's context)
// without a GPU. Ranks in separate processes are on separate sim devices;
// in-process ranks share one, as in-process GPU ranks share a GPU, and take
// staged collectives under auto.
func init() {
	collective.RegisterBackend(fakeNCCL{collective.NCCLBackend(tensor.Sim, collective.FakeNCCL(collective.FakeNCCLOptions{Resolve: sim.Resolve, Current: sim.Current}))})
}

type fakeNCCL struct{ collective.DeviceBackend }

func (b fakeNCCL) Serves(dev tensor.Device) bool {
	return os.Getenv(collective.EnvNCCLLibrary) == "fake" && b.DeviceBackend.Serves(dev)
}
