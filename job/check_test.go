package job

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/runlog"
)

// check runs the worker in check mode with env as the launcher would set it.
func check(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	e := map[string]string{EnvCheck: "1", "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
	for k, v := range env {
		e[k] = v
	}
	var out, errb bytes.Buffer
	code := Main(context.Background(), Env{Args: args, Getenv: func(k string) string { return e[k] }, Stdout: &out, Stderr: &errb})
	return code, out.String(), errb.String()
}

// TestCheckMode: with MESHRUN_CHECK=1 the worker checks a workload's
// arguments against the job's environment exactly as a rank would, and stops:
// exit 0 with no output and nothing done (no sleep, no NATS, no training, no
// rank folder), or exit 2 with one line naming the problem.
func TestCheckMode(t *testing.T) {
	rankDir := filepath.Join(t.TempDir(), "rank-00000")
	good := []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"hello"}, nil},
		{[]string{"sleep", "10m"}, nil},
		{[]string{"exit", "3"}, nil},
		{[]string{"barrier"}, map[string]string{"MESHRUN_NATS_URL": "nats://127.0.0.1:1"}},
		{[]string{"mlp", "--steps", "1000000"}, nil},
		{[]string{"mlp", "--mesh", "dp=2,tp=1", "--hidden", "65536", "--tokens", "65536"}, map[string]string{EnvMemoryCheck: "0"}}, // planned, nothing allocated
		{[]string{"mlp"}, map[string]string{"MESHRUN_DTYPE": "bfloat16", "MESHRUN_DEVICE": "sim"}},
		{[]string{"linear", "--mesh", "2", "--x", "8x16:[S(0)]", "--w", "32x16:[S(0)]"}, nil},
		{[]string{"verify"}, nil},
	}
	for _, tc := range good {
		env := map[string]string{runlog.EnvRankDir: rankDir}
		for k, v := range tc.env {
			env[k] = v
		}
		code, out, errs := check(t, env, tc.args...)
		if code != 0 || out != "" || errs != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 0 and no output", tc.args, code, out, errs)
		}
	}
	if _, err := os.Stat(rankDir); !os.IsNotExist(err) {
		t.Errorf("a check opened the rank's logs: %v", err)
	}
	bad := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"mlp", "--tokns", "5"}, nil, "unknown flag --tokns; did you mean --tokens?"},
		{[]string{"mlp", "--mesh", "tp=4"}, nil, "world size is 2"},
		{[]string{"mlp", "--dtype", "fp8"}, nil, `--dtype "fp8"`},
		{[]string{"mlp"}, map[string]string{"MESHRUN_DTYPE": "int8"}, `--dtype "int8"`},
		{[]string{"gpt"}, map[string]string{"MESHRUN_CUDA_ATTENTION": "fsued"}, "MESHRUN_CUDA_ATTENTION=fsued: want kernels or fused or gemm, or unset"},
		{[]string{"mlp", "--resume", filepath.Join(t.TempDir(), "missing")}, nil, "--resume"},
		{[]string{"mlp", "--save-every", "5"}, nil, "--save-every needs --save"},
		{[]string{"linear", "--mesh", "2", "--x", "8x16:[S(0)]", "--w", "32x15:[S(0)]"}, nil, "shape mismatch"},
		{[]string{"linear", "--mesh", "4", "--x", "8x16:[S(0)]", "--w", "32x16:[S(0)]"}, nil, "world size is 2"},
		{[]string{"verify", "--world", "3"}, nil, "--world 3, but the job has 2 ranks"},
		{[]string{"sleep", "soon"}, nil, "soon"},
		{[]string{"exit"}, nil, "want CODE [RANK]"},
	}
	for _, name := range []string{"openblas", "cuda"} {
		if !providers.Compiled(name) {
			bad = append(bad, struct {
				args []string
				env  map[string]string
				want string
			}{[]string{"mlp", "--kernels", name}, nil, "go build -tags " + name})
		}
	}
	for _, tc := range bad {
		code, out, errs := check(t, tc.env, tc.args...)
		if code != ExitUsage || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", tc.args, code, out, errs, tc.want)
		}
	}
}

// TestCheckDevice: with MESHRUN_CHECK=device the worker, given no workload,
// prints the ranks' device the launcher's MESHRUN_DEVICE, MESHRUN_KERNELS and
// MESHRUN_DTYPE resolve to, or exits 2 with the one line that refuses them.
func TestCheckDevice(t *testing.T) {
	for _, tc := range []struct {
		env        map[string]string
		code       int
		out, inErr string
	}{
		{nil, 0, "cpu\n", ""},
		{map[string]string{EnvKernels: "sim"}, 0, "sim\n", ""},
		{map[string]string{EnvDevice: "cpu", EnvKernels: "cpu,gemm=cpu", providers.EnvDType: "bfloat16"}, 0, "cpu\n", ""},
		{map[string]string{EnvDevice: "cpu", EnvKernels: "sim"}, ExitUsage, "", "--kernels sim: provider sim runs on sim, the rank's tensors are on cpu (--device)\n"},
		{map[string]string{EnvKernels: "nosuch"}, ExitUsage, "", `unknown provider "nosuch"`},
		{map[string]string{providers.EnvDType: "fp8"}, ExitUsage, "", `--dtype "fp8": want float32 or bfloat16` + "\n"},
	} {
		env := map[string]string{EnvCheck: CheckDevice}
		for k, v := range tc.env {
			env[k] = v
		}
		var out, errb bytes.Buffer
		code := Main(context.Background(), Env{Getenv: func(k string) string { return env[k] }, Stdout: &out, Stderr: &errb})
		if code != tc.code || out.String() != tc.out || !strings.Contains(errb.String(), tc.inErr) || strings.Count(errb.String(), "\n") > 1 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, %q, %q", tc.env, code, out.String(), errb.String(), tc.code, tc.out, tc.inErr)
		}
	}
}
