// Package pythontest finds the Python interpreter that the tests comparing
// meshrun with NumPy or PyTorch run their scripts with.
package pythontest

import (
	"os"
	"os/exec"
	"testing"
)

// Python returns an interpreter that imports every module of modules (a
// Python import list, "torch, numpy"): $MESHRUN_PYTHON, else
// /usr/bin/python3, else python3. Without one it skips t, unless the
// environment variable require is set (CI sets it where it installed the
// modules), and then fails t.
func Python(t testing.TB, modules, require string) string {
	t.Helper()
	for _, p := range []string{os.Getenv("MESHRUN_PYTHON"), "/usr/bin/python3", "python3"} {
		if p != "" && exec.Command(p, "-c", "import "+modules).Run() == nil {
			return p
		}
	}
	if os.Getenv(require) != "" {
		t.Fatalf("no python3 with %s, and %s is set", modules, require)
	}
	t.Skipf("no python3 with %s", modules)
	return ""
}
