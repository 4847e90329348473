package logview

import (
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// The views read a job's folder and nothing of the launcher that wrote it:
// logview does not import launch (launch imports logview, for the folder's
// layout and types and the reading of crash reports).
func TestLayeringNoLaunch(t *testing.T) {
	deps.Forbid(t, []string{deps.Module + "/logview"}, deps.Module+"/launch")
}
