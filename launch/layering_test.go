package launch

import (
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// The launcher, its views (logview) and runlog read the control plane
// through package protocol only: linking collective (and what it may grow to
// import: transports, CUDA, NCCL) into the launcher is a layering error
// (docs/architecture.md). The test program testdata/ranktest is a worker and
// may import collective.
func TestLayering(t *testing.T) {
	deps.Forbid(t, []string{deps.Module + "/launch", deps.Module + "/logview", deps.Module + "/runlog"}, deps.Module+"/collective")
}

// The launcher links no kernels package and no CUDA, in the plain build and
// the cuda one: the worker checks --kernels and --dtype against the
// providers it has (job.CheckDevice), and the cuda launcher loads the driver
// only to count GPUs, so it starts on a machine without one
// (TestCUDALauncherWithoutDriver runs it there).
func TestLauncherLinksNoKernels(t *testing.T) {
	launcher := []string{deps.Module + "/cmd/launcher"}
	forbidden := []string{deps.Module + "/kernels", "gorgonia.org/cu"}
	deps.Forbid(t, launcher, forbidden...)
	deps.ForbidTags(t, "cuda", launcher, forbidden...)
}
