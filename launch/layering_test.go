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
