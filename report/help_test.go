package report

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/meshrun/meshrun/internal/goldenfile"
)

// TestHelp pins `launcher report -h`.
func TestHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main([]string{"-h"}, &out, &errb); code != 0 || errb.Len() > 0 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	goldenfile.Check(t, filepath.Join("testdata", "help", "report.txt"), out.String())
}
