package models_test

import (
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// The models sit between the layers and the workloads: package job runs
// them, and they never import it.
func TestLayering(t *testing.T) {
	deps.Forbid(t, []string{deps.Module + "/models"}, deps.Module+"/job")
}
