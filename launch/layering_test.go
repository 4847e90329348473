package launch

import (
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// The launcher and runlog read the control plane through package protocol
// only: linking collective (and what it may grow to import: transports, CUDA,
// NCCL) into the launcher is a layering error (docs/architecture.md). The
// test program testdata/ranktest is a worker and may import collective.
func TestLayering(t *testing.T) {
	deps.Forbid(t, []string{deps.Module + "/launch", deps.Module + "/runlog"}, deps.Module+"/collective")
}

// The launcher checks --device and --kernels with the providers' catalog and
// builds no provider: a cuda launcher then links no CUDA library and starts
// on a machine without the driver (TestCUDALauncherWithoutDriver checks the
// cuda build's dependencies).
func TestLayeringNoProviders(t *testing.T) {
	deps.Forbid(t, []string{deps.Module + "/launch"}, deps.Module+"/kernels/cpu", deps.Module+"/kernels/sim",
		deps.Module+"/kernels/openblas", deps.Module+"/kernels/cuda", "gorgonia.org/cu")
}
