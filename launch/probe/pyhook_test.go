package probe

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const testPython = "/usr/bin/python3"

// pyHookCmd is a python3 command for script with the hook on PYTHONPATH
// (then extra) and MESHRUN_RANK_DIR set to a new folder, which it returns.
func pyHookCmd(t *testing.T, script string, extra string, env ...string) (*exec.Cmd, string) {
	t.Helper()
	if _, err := os.Stat(testPython); err != nil {
		t.Skip("no " + testPython)
	}
	work := t.TempDir()
	hook, err := WritePythonHook(filepath.Join(work, "hook"))
	if err != nil {
		t.Fatal(err)
	}
	rankDir := filepath.Join(work, "rank-00000")
	if err := os.Mkdir(rankDir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(work, "train.py")
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testPython, "-u", path)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "PYTHONPATH="+PythonPathWith(hook, extra), "MESHRUN_RANK_DIR="+rankDir,
		"PYTHONDONTWRITEBYTECODE=1", "MESHRUN_PYTHON_HOOK_PID=")
	cmd.Env = append(cmd.Env, env...)
	return cmd, rankDir
}

const helloLine = `@meshrun:hello {"stacks_on_sigusr1":true,"runtime":"python","stacks_file":"stacks-python.txt","pid":`

func TestPythonHookHello(t *testing.T) {
	cmd, _ := pyHookCmd(t, "print('first output')\n", "")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	lines := strings.Split(string(out), "\n")
	want := helloLine + strconv.Itoa(cmd.Process.Pid) + "}"
	if lines[0] != want || lines[1] != "first output" {
		t.Fatalf("output %q, want %q then the program's", out, want)
	}
}

func TestPythonHookStacksOnSIGUSR1(t *testing.T) {
	script := `import os, queue, threading, time
q = queue.Queue()
def loader():
    q.get()
threading.Thread(target=loader, name="loader", daemon=True).start()
def block_here():
    print("blocking", flush=True)
    while not os.path.exists("stop"):
        time.sleep(0.02)
block_here()
print("done")
`
	cmd, rankDir := pyHookCmd(t, script, "")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stdout)
	for _, want := range []string{helloLine, "blocking"} {
		if !sc.Scan() || !strings.HasPrefix(sc.Text(), want) {
			t.Fatalf("stdout %q, want %q (stderr %s)", sc.Text(), want, stderr.String())
		}
	}
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	stacks := filepath.Join(rankDir, PythonStacksFile)
	var dump string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(stacks)
		if dump = string(b); strings.Contains(dump, "in block_here") && strings.Contains(dump, "in loader") {
			break
		}
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(rankDir), "stop"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if !sc.Scan() || sc.Text() != "done" {
		t.Errorf("after SIGUSR1 stdout %q, want done", sc.Text())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v after SIGUSR1: %s", err, stderr.String())
	}
	if !strings.Contains(dump, "in block_here") || !strings.Contains(dump, "in loader") || strings.Count(dump, "hread 0x") != 2 {
		t.Fatalf("stacks-python.txt without both threads:\n%s", dump)
	}
	if fi, err := os.Stat(stacks); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("stacks file %v %v, want mode 0600", fi.Mode(), err)
	}
}

func TestPythonHookException(t *testing.T) {
	script := `import json

def load_batch():
    raise ValueError("bad batch 7")

load_batch()
`
	cmd, rankDir := pyHookCmd(t, script, "")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want 1", err)
	}
	if !strings.Contains(stderr.String(), "Traceback (most recent call last):") || !strings.HasSuffix(stderr.String(), "ValueError: bad batch 7\n") {
		t.Errorf("stderr without the traceback:\n%s", stderr.String())
	}
	b, err := os.ReadFile(filepath.Join(rankDir, PythonExceptionFile))
	if err != nil {
		t.Fatal(err)
	}
	type frame struct {
		File string `json:"file"`
		Line int    `json:"line"`
		Func string `json:"func"`
	}
	var rec struct {
		Type      string  `json:"type"`
		Message   string  `json:"message"`
		Frames    []frame `json:"frames"`
		UserFrame *frame  `json:"user_frame"`
		Thread    string  `json:"thread"`
		TimeMS    int64   `json:"time_ms"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Type != "ValueError" || rec.Message != "bad batch 7" || rec.Thread != "MainThread" || rec.TimeMS == 0 {
		t.Errorf("exception.json %s", b)
	}
	if u := rec.UserFrame; u == nil || u.Func != "load_batch" || u.Line != 4 || filepath.Base(u.File) != "train.py" {
		t.Errorf("user frame %+v, want load_batch at train.py:4", u)
	}
	if len(rec.Frames) != 2 || rec.Frames[0].Func != "<module>" || rec.Frames[0].Line != 6 {
		t.Errorf("frames %+v, want <module>:6 then load_batch:4", rec.Frames)
	}
	if left, _ := filepath.Glob(filepath.Join(rankDir, ".*tmp")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// The user's own sitecustomize, further on PYTHONPATH, still runs, and a
// failing one is reported as Python reports it.
func TestPythonHookChainsSitecustomize(t *testing.T) {
	user := t.TempDir()
	os.WriteFile(filepath.Join(user, "sitecustomize.py"), []byte("import sys\nsys.user_site_ran = 42\n"), 0o600)
	cmd, _ := pyHookCmd(t, "import sys, sitecustomize\nprint(sys.user_site_ran, sitecustomize.__file__)\n", user)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := "42 " + filepath.Join(user, "sitecustomize.py")
	if lines := strings.Split(string(out), "\n"); len(lines) < 2 || lines[1] != want {
		t.Errorf("output %q, want %q after the hello line", out, want)
	}

	os.WriteFile(filepath.Join(user, "sitecustomize.py"), []byte("raise RuntimeError('user site broke')\n"), 0o600)
	cmd, _ = pyHookCmd(t, "print('program ran')\n", user)
	out, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !strings.Contains(string(out), "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nRuntimeError: user site broke\n") ||
		!strings.Contains(string(out), "program ran") {
		t.Errorf("output %q", out)
	}
}

func TestPythonHookOff(t *testing.T) {
	script := `def load_batch():
    raise ValueError("bad batch 7")
print("plain")
load_batch()
`
	cmd, rankDir := pyHookCmd(t, script, "", EnvPythonHook+"=0")
	out, _ := cmd.Output()
	if string(out) != "plain\n" {
		t.Errorf("stdout %q, want the program's only", out)
	}
	if ents, _ := os.ReadDir(rankDir); len(ents) != 0 {
		t.Errorf("rank folder holds %v with the hook off", ents)
	}
}

// A Python process the rank's own starts (multiprocessing's spawn) stays
// quiet: one hello, the rank's.
func TestPythonHookChildQuiet(t *testing.T) {
	script := `import subprocess, sys
subprocess.run([sys.executable, "-c", "print('child')"], check=True)
`
	cmd, _ := pyHookCmd(t, script, "")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if strings.Count(string(out), "@meshrun:hello") != 1 || !strings.Contains(string(out), "child\n") {
		t.Errorf("output %q, want one hello", out)
	}
}

func TestPythonPathWith(t *testing.T) {
	for _, c := range []struct{ existing, want string }{
		{"", "/h"},
		{"/a", "/h:/a"},
		{"/a::/b:", "/h:/a:/b"},
		{"/h:/a", "/h:/a"},
	} {
		if got := PythonPathWith("/h", c.existing); got != c.want {
			t.Errorf("PythonPathWith(/h, %q) = %q, want %q", c.existing, got, c.want)
		}
	}
}
