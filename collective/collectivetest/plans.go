package collectivetest

import (
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/placement"
)

func testPlans(t *testing.T, ws []*collective.World, mesh placement.Mesh) {}
