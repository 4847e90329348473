package planview

import (
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// Printing a plan runs nothing: planview does not import launch, which starts
// and supervises ranks (cmd/launcher hands plan to planview, every other
// command but the views to launch), nor what runs a plan (collective,
// redistribute, kernels).
func TestLayeringNoLaunch(t *testing.T) {
	deps.Forbid(t, []string{deps.Module + "/planview"},
		deps.Module+"/launch", deps.Module+"/collective", deps.Module+"/redistribute", deps.Module+"/kernels")
}
