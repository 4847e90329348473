package linear_test

import (
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// The layer sits below the models built on it: linear (and its layout)
// exports what a model needs and never reaches up into package models, nor
// into the workloads (job) that run them.
func TestLayeringModels(t *testing.T) {
	deps.Forbid(t, []string{deps.Module + "/linear/..."}, deps.Module+"/models", deps.Module+"/job")
}
