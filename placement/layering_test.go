package placement_test

import (
	"strings"
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// Placement is pure: specs in, plans out. Of the module it imports tensor
// only (for tensor.Box and the reduce ops it shares with collective), never
// what moves data (collective, redistribute) or what plans above it (spmd).
func TestLayering(t *testing.T) {
	for _, d := range deps.Of(t, deps.Module+"/placement") {
		if strings.HasPrefix(d.ImportPath, deps.Module+"/") && d.ImportPath != deps.Module+"/placement" && d.ImportPath != deps.Module+"/tensor" {
			t.Errorf("placement depends on %s", d.ImportPath)
		}
	}
}
