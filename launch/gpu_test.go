package launch

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/launch/cudadriver"
)

// TestCUDALauncherWithoutDriver builds the launcher with -tags cuda (it
// needs no CUDA header or library: it links neither kernels/cuda nor
// gorgonia.org/cu, and loads the driver only to count GPUs) and shows that on
// this machine it runs a cpu job (the plain worker's MLP) and a program; that
// --device cuda without the driver exits 2 naming the library the loader
// could not open, before any rank starts; and that with a stand-in driver
// -n gpu starts one cuda rank per GPU the driver reports.
func TestCUDALauncherWithoutDriver(t *testing.T) {
	if out, err := exec.Command("go", "env", "CGO_ENABLED").Output(); err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Skip("cgo is off: a cuda build needs it")
	}
	deps, err := exec.Command("go", "list", "-tags", "cuda", "-deps", "../cmd/launcher").Output()
	if err != nil {
		t.Fatalf("go list -tags cuda -deps ../cmd/launcher: %v", err)
	}
	for _, p := range strings.Fields(string(deps)) {
		if strings.HasPrefix(p, "gorgonia.org/cu") || p == "github.com/meshrun/meshrun/kernels/cuda" || p == "github.com/meshrun/meshrun/kernels/providers" {
			t.Errorf("the cuda launcher imports %s", p)
		}
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-tags", "cuda", "-o", dir+string(filepath.Separator), "../cmd/launcher")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags cuda ../cmd/launcher: %v\n%s", err, out)
	}
	launcher := filepath.Join(dir, "launcher")
	mark := filepath.Join(dir, "ran")
	fake := filepath.Join(dir, "fakeworker")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\ntouch "+mark+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, env []string, args ...string) (int, string, string, string) {
		t.Helper()
		logDir := t.TempDir()
		cmd := exec.Command(launcher, append([]string{"run", "--log-dir", logDir, "--job-id", "cudalauncher", "--grace", "2s"}, args...)...)
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "CUDA_VISIBLE_DEVICES=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.Run()
		return cmd.ProcessState.ExitCode(), logDir, stdout.String(), stderr.String()
	}
	t.Run("cpu job", func(t *testing.T) {
		code, _, stdout, stderr := run(t, nil, "-n", "2", "--worker", worker(), "mlp", "--tokens", "33", "--hidden", "16", "--steps", "2")
		if code != 0 || !strings.Contains(stdout, `"device":"cpu"`) {
			t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
		}
	})
	t.Run("program", func(t *testing.T) {
		if code, _, _, stderr := run(t, nil, "-n", "1", "--", "true"); code != 0 {
			t.Errorf("exit %d: %s", code, stderr)
		}
	})
	t.Run("device cuda without the driver", func(t *testing.T) {
		if n, err := cudadriver.Count(""); err == nil {
			t.Skipf("this machine has the driver (%d GPUs)", n)
		}
		for _, args := range [][]string{
			{"-n", "1", "--device", "cuda", "--worker", fake, "mlp"},
			{"-n", "1", "--device", "cuda", "--", fake},
			{"-n", "gpu", "--worker", fake, "mlp"},
		} {
			code, logDir, _, stderr := run(t, nil, args...)
			if code != ExitUsage || strings.Count(stderr, "\n") != 1 ||
				!strings.Contains(stderr, "libcuda.so.1: cannot open shared object file") || !strings.Contains(stderr, "no NVIDIA driver on this machine") {
				t.Errorf("%v: exit %d, want %d and one line naming libcuda.so.1; stderr:\n%s", args, code, ExitUsage, stderr)
			}
			if ents, _ := os.ReadDir(logDir); len(ents) != 0 {
				t.Errorf("%v: the refused job left %v in the log dir", args, ents)
			}
		}
		if _, err := os.Stat(mark); !os.IsNotExist(err) {
			t.Errorf("a worker ran: %v", err)
		}
	})
	t.Run("stand-in driver", func(t *testing.T) {
		if _, err := exec.LookPath("gcc"); err != nil {
			t.Skip("no gcc to build a stand-in driver")
		}
		libs := t.TempDir()
		out, err := exec.Command("gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", filepath.Join(libs, "libcuda.so.1"), "cudadriver/testdata/fakecuda.c").CombinedOutput()
		if err != nil {
			t.Fatalf("gcc: %v\n%s", err, out)
		}
		env := []string{"LD_LIBRARY_PATH=" + libs, "FAKE_CUDA_DEVICES=2"}
		code, _, stdout, stderr := run(t, env, "--dry-run", "-n", "gpu", "--worker", fake, "mlp")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		var gpus []string
		for _, l := range strings.Split(strings.TrimSpace(stdout), "\n")[2:] {
			if f := strings.Fields(l); len(f) >= 7 && f[4] == "cuda" {
				gpus = append(gpus, f[5])
			}
		}
		if strings.Join(gpus, ",") != "0,1" {
			t.Errorf("GPUs %v, want 0,1 (cuda ranks):\n%s", gpus, stdout)
		}
		// The driver loads and sees no device.
		code, _, _, stderr = run(t, append(env, "FAKE_CUDA_INIT=100"), "-n", "1", "--device", "cuda", "--worker", fake, "mlp")
		if code != ExitUsage || !strings.Contains(stderr, "no GPU visible") {
			t.Errorf("no device: exit %d: %s", code, stderr)
		}
	})
}
