package probe

import (
	_ "embed"
	"os"
	"path/filepath"
	"strings"
)

// The launcher's Python site hook (pyhook/sitecustomize.py), put first on
// PYTHONPATH of every rank of a program that is not a meshrun worker: a
// Python rank then dumps every thread's stack to its folder on SIGUSR1
// (stacks-python.txt, announced by an "@meshrun:hello" line as runlog's
// workers announce theirs), records its uncaught exception in exception.json,
// and runs whatever sitecustomize the hook hides. Programs that are not
// Python never read it. MESHRUN_PYTHON_HOOK=0 turns it off.
//
// SIGUSR1 kills a Python process that has not yet registered the handler
// (its default action), so a rank is sent it only once its hello line said
// "stacks_on_sigusr1". faulthandler walks every thread's frames from the
// signal handler without the GIL: a thread that is exiting at that moment
// can crash the process (CPython 3.11 segfaults when signaled in a loop while
// threads come and go), so a rank is sent it once per hang, not polled.

//go:embed pyhook/sitecustomize.py
var pythonHook []byte

// Names of the hook's files and variables.
const (
	// PythonStacksFile is where a Python rank's stacks go, in its folder;
	// every dump is appended.
	PythonStacksFile = "stacks-python.txt"
	// PythonExceptionFile is a Python rank's first uncaught exception.
	PythonExceptionFile = "exception.json"
	// EnvPythonHook set to 0 turns the hook off.
	EnvPythonHook = "MESHRUN_PYTHON_HOOK"
)

// WritePythonHook writes the hook's sitecustomize.py into dir (made 0700 if
// missing) and returns dir, the PYTHONPATH entry.
func WritePythonHook(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "sitecustomize.py")
	tmp, err := os.CreateTemp(dir, ".sitecustomize-*.py")
	if err != nil {
		return "", err
	}
	_, err = tmp.Write(pythonHook)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// CreateTemp makes it 0600: the ranks run as the launcher's user.
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return "", err
	}
	return dir, nil
}

// PythonPathWith is the PYTHONPATH value with hookDir first, then the
// entries of existing (empty entries dropped).
func PythonPathWith(hookDir, existing string) string {
	parts := []string{hookDir}
	for _, p := range strings.Split(existing, string(os.PathListSeparator)) {
		if p != "" && p != hookDir {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, string(os.PathListSeparator))
}
