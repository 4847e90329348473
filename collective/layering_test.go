package collective_test

import (
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// Collective moves buffers between ranks and knows nothing of placements:
// package redistribute, above it, executes placement plans with it. Importing
// placement, spmd (which plans with placement) or redistribute here would turn
// the layering around.
func TestLayering(t *testing.T) {
	deps.Forbid(t, []string{deps.Module + "/collective"}, deps.Module+"/placement", deps.Module+"/spmd", deps.Module+"/redistribute")
}
