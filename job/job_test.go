package job

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/spmd/spmdtest"
	"github.com/meshrun/meshrun/tensor"
)

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return runEnv(t, nil, args...)
}

// runEnv is run with the worker's environment env.
func runEnv(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(context.Background(), Env{Args: args, Getenv: func(k string) string { return env[k] }, Stdout: &out, Stderr: &errb})
	return code, out.String(), errb.String()
}

func TestLinearWorkload(t *testing.T) {
	code, out, errs := run(t, "linear", "--mesh", "dp=2,tp=2", "--x", "8x16:[S(0),R]", "--w", "32x16:[R,S(0)]", "--b", "32:[R,S(0)]",
		"--model", spmdtest.LargeLayersFile(t))
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, out, errs)
	}
	var r LinearReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	if !r.PlanMatch || r.MaxRelErr > 1e-5 || len(r.Errors) != 4 || r.Y != "8x32:[S(0),S(1)]" {
		t.Fatalf("report %+v", r)
	}
}

// TestModelFlag: a model file that is not one is a usage error before any
// work; the default model plans the tiny layer whole on every dp rank.
func TestModelFlag(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"alpha_s": 1e-6, "beta_bytes_per_s": 0, "flops_per_s": 1e9}`), 0o644)
	for _, w := range []string{"linear", "mlp"} {
		args := []string{w, "--model", bad}
		if w == "linear" {
			args = append(args, "--mesh", "2", "--x", "8x16:[S(0)]", "--w", "32x16:[R]")
		}
		code, out, errs := run(t, args...)
		if code != ExitUsage || out != "" || !strings.Contains(errs, "--model") || !strings.Contains(errs, "beta") {
			t.Errorf("%s: exit %d, %q %q", w, code, out, errs)
		}
	}
	code, out, errs := run(t, "linear", "--mesh", "dp=2,tp=2", "--x", "8x16:[S(0),R]", "--w", "32x16:[R,S(0)]", "--b", "32:[R,S(0)]")
	var r LinearReport
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil || !r.PlanMatch || r.Y != "8x32:[R,S(1)]" {
		t.Fatalf("default model: exit %d, %q %q", code, out, errs)
	}
}

func TestLinearLoadDump(t *testing.T) {
	dir := t.TempDir()
	x, _ := tensor.FromFloat32([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	w, _ := tensor.FromFloat32([]float32{1, 0, 0, 0, 1, 0}, 2, 3)
	b, _ := tensor.FromFloat32([]float32{10, 20}, 2)
	dy, _ := tensor.FromFloat32([]float32{1, 1, 1, 1}, 2, 2)
	for name, tt := range map[string]*tensor.Tensor{"x": x, "w": w, "b": b, "dy": dy} {
		if err := tt.Save(filepath.Join(dir, name+".npy")); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errs := run(t, "linear", "--mesh", "2", "--x", "2x3:[S(1)]", "--w", "2x3:[S(1)]", "--b", "2:[R]", "--load", dir, "--dump", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, out, errs)
	}
	y, err := tensor.Load(filepath.Join(dir, "y.npy"))
	if err != nil {
		t.Fatal(err)
	}
	// y = x·Wᵀ + b: rows (1+10, 2+20), (4+10, 5+20).
	if got := y.Float32(); len(got) != 4 || got[0] != 11 || got[1] != 22 || got[2] != 14 || got[3] != 25 {
		t.Fatalf("y = %v", y.Float32())
	}
	db, _ := tensor.Load(filepath.Join(dir, "db.npy"))
	if got := db.Float32(); got[0] != 2 || got[1] != 2 {
		t.Fatalf("db = %v", got)
	}
	for _, f := range []string{"dx.npy", "dw.npy"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{"linear", "--mesh", "4", "--x", "8x16:[R]", "--w", "32x15:[R]"},
		{"linear", "--mesh", "dp=2,tp=2", "--x", "8x16:[R]", "--w", "32x16:[R]"},
		{"linear", "--bogus"},
		{"linear", "--mesh", "4", "--x", "8x16:[R]", "--w", "32x16:[R]", "--load", "/nonexistent"},
		{"mlp", "--mesh", "0"},
		{"mlp", "--steps", "0"},
		{"verify", "--ops", "conv"},
		{"nosuch"},
	} {
		code, out, errs := run(t, args...)
		if code != ExitUsage || out != "" || !strings.HasPrefix(errs, "worker") {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
}

func TestMLPWorkload(t *testing.T) {
	code, out, errs := run(t, "mlp", "--mesh", "tp=2", "--sequence-parallel", "--tokens", "16", "--hidden", "8", "--steps", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "step 1/3 loss ") {
		t.Fatalf("output %q", out)
	}
	var r MLPReport
	if err := json.Unmarshal([]byte(lines[3]), &r); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"all_gather x": 1, "reduce_scatter y": 1, "all_gather dy": 1, "reduce_scatter dx": 1, "all_reduce loss": 1}
	if len(r.Collectives) != len(want) {
		t.Fatalf("collectives %v, want %v", r.Collectives, want)
	}
	for k, v := range want {
		if r.Collectives[k] != v {
			t.Fatalf("collectives %v, want %v", r.Collectives, want)
		}
	}
	if r.LossLast >= r.LossFirst || r.StepMSMedian <= 0 || r.CommBytesPerStep <= 0 {
		t.Fatalf("report %+v", r)
	}
}

// TestVerify runs every case verify enumerates at world sizes 1 to 3, and the
// quick set at 4 (the full set at 4 runs in `launcher run -n 4 verify`).
func TestVerify(t *testing.T) {
	for _, tc := range []struct {
		world string
		quick bool
	}{{"1", false}, {"2", false}, {"3", false}, {"4", true}} {
		args := []string{"verify", "--world", tc.world}
		if tc.quick {
			args = append(args, "--quick")
		}
		code, out, errs := run(t, args...)
		if code != 0 || !strings.Contains(out, "passed") || strings.Contains(out, "FAIL") {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errs)
		}
	}
}
