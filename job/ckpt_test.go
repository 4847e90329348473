package job

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/ckpt/ckpttest"
	"github.com/meshrun/meshrun/tensor"
)

func mlpReport(t *testing.T, args ...string) MLPReport {
	t.Helper()
	return mlpRun(t, append([]string{"--tokens", "16", "--hidden", "10", "--ffn", "22"}, args...)...)
}

// mlpRun runs worker mlp with args and returns its JSON report.
func mlpRun(t *testing.T, args ...string) MLPReport {
	t.Helper()
	code, out, errs := run(t, append([]string{"mlp"}, args...)...)
	if code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r MLPReport
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestMLPSaveResume: saved on tp=4 every 5 steps, resumed at step 5 on
// dp=2,tp=2, tp=3 and one rank, the run ends with the uninterrupted run's loss.
func TestMLPSaveResume(t *testing.T) {
	dir := t.TempDir()
	full := mlpReport(t, "--mesh", "tp=4", "--steps", "10", "--save", dir, "--save-every", "5")
	if steps, _ := ckpt.Steps(ckpt.OS, dir); len(steps) != 2 || steps[0] != 5 || steps[1] != 10 {
		t.Fatalf("checkpoints %v", steps)
	}
	for _, mesh := range []string{"dp=2,tp=2", "tp=3", "1", "tp=2 --device sim"} {
		args := append(strings.Fields("--mesh "+mesh), "--steps", "10", "--resume", ckpt.StepDir(dir, 5))
		r := mlpReport(t, args...)
		if r.FirstStep != 6 || math.Abs(r.LossLast-full.LossLast) > 1e-6*full.LossLast {
			t.Errorf("%s: resumed at %d, loss %v, uninterrupted %v", mesh, r.FirstStep, r.LossLast, full.LossLast)
		}
	}
	// --resume DIR takes the newest: step 10 leaves nothing to train.
	if code, _, errs := run(t, "mlp", "--tokens", "16", "--hidden", "10", "--ffn", "22", "--steps", "10", "--resume", dir); code != ExitUsage || !strings.Contains(errs, "step 10") {
		t.Errorf("resume at the last step: exit %d %s", code, errs)
	}
}

// TestResumeDamaged: a damaged checkpoint or one of another model is refused
// with exit 2 and an error naming the file or the tensor, nothing trained.
func TestResumeDamaged(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(dir string)
		args   []string
		want   string
	}{
		{"flipped byte", func(dir string) { ckpttest.FlipByte(t, filepath.Join(dir, "rank-00001.safetensors"), -3) }, nil, `rank-00001.safetensors: tensor "`},
		{"truncated file", func(dir string) {
			name := filepath.Join(dir, "rank-00000.safetensors")
			st, _ := os.Stat(name)
			os.Truncate(name, st.Size()-100)
		}, nil, "rank-00000.safetensors: "},
		{"missing file", func(dir string) { os.Remove(filepath.Join(dir, "rank-00001.safetensors")) }, nil, "rank-00001.safetensors: file missing"},
		{"wrong shape", func(string) {}, []string{"--hidden", "12"}, `tensor "down.bias" is float32 [10], the model wants float32 [12]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			mlpReport(t, "--mesh", "tp=2", "--steps", "2", "--save", root)
			tc.damage(ckpt.StepDir(root, 2))
			args := append([]string{"mlp", "--mesh", "tp=2", "--tokens", "16", "--hidden", "10", "--ffn", "22", "--steps", "4", "--resume", root}, tc.args...)
			code, out, errs := run(t, args...)
			if code != ExitUsage || strings.Contains(out, "step 3") || !strings.Contains(errs, tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 naming %q", code, out, errs, tc.want)
			}
		})
	}
}

// TestMLPInit: --init starts from full weights another tool wrote (a plain
// safetensors file named up.weight, up.bias, down.weight, down.bias): the
// first loss is the one of a run resumed from the same weights, on any mesh.
func TestMLPInit(t *testing.T) {
	dir := t.TempDir()
	saved := mlpReport(t, "--mesh", "tp=2", "--steps", "3", "--save", dir)
	c, err := ckpt.Open(ckpt.OS, dir)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "model.safetensors")
	if _, err := ckpt.Convert(ckpt.OS, c, file, nil); err != nil {
		t.Fatal(err)
	}
	resumed := mlpReport(t, "--mesh", "tp=2", "--steps", "4", "--resume", dir)
	for _, mesh := range []string{"tp=3", "1"} {
		r := mlpReport(t, "--mesh", mesh, "--steps", "1", "--init", file)
		if r.FirstStep != 1 || math.Abs(r.LossFirst-resumed.LossFirst) > 1e-6*resumed.LossFirst {
			t.Errorf("%s: --init loss %v, resumed %v (saved after %v)", mesh, r.LossFirst, resumed.LossFirst, saved.LossLast)
		}
	}
	if code, _, errs := run(t, "mlp", "--steps", "1", "--init", file, "--resume", dir); code != ExitUsage || !strings.Contains(errs, "pick one") {
		t.Errorf("--init and --resume: exit %d %s", code, errs)
	}
	// Weights of the right shapes in another dtype are refused, naming the tensor.
	var entries []ckpt.Entry
	var data [][]byte
	for _, name := range c.Names() {
		w, err := c.ReadAll(name)
		if err != nil {
			t.Fatal(err)
		}
		if name == "down.weight" {
			w, _ = tensor.Convert(w, tensor.BFloat16)
		}
		entries = append(entries, ckpt.Entry{Name: name, DType: w.DType(), Shape: w.Shape()})
		data = append(data, tensor.HostBytes(w))
	}
	other := filepath.Join(t.TempDir(), "bf16.safetensors")
	if _, err := ckpt.WriteFile(ckpt.OS, other, entries, data, nil); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run(t, "mlp", "--tokens", "16", "--hidden", "10", "--ffn", "22", "--steps", "1", "--init", other); code != ExitUsage || !strings.Contains(errs, `"down.weight" is bfloat16`) {
		t.Errorf("bfloat16 weights for a float32 model: exit %d %s", code, errs)
	}
}

// TestMLPRestartResumesFromSave: under a launcher's restart
// (TORCHELASTIC_RESTART_COUNT > 0), mlp --save DIR with no --resume resumes
// from DIR's newest checkpoint, before --init; with none there yet it starts
// over; on the first attempt DIR is only written.
func TestMLPRestartResumesFromSave(t *testing.T) {
	restart := func(n string, args ...string) (MLPReport, string) {
		t.Helper()
		var out, errb bytes.Buffer
		args = append([]string{"mlp", "--tokens", "16", "--hidden", "10", "--ffn", "22", "--mesh", "tp=2"}, args...)
		env := map[string]string{EnvRestartCount: n}
		if code := Main(context.Background(), Env{Args: args, Getenv: func(k string) string { return env[k] }, Stdout: &out, Stderr: &errb}); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		var r MLPReport
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
			t.Fatal(err)
		}
		return r, errb.String()
	}
	dir := t.TempDir()
	full := mlpReport(t, "--mesh", "tp=2", "--steps", "10")
	if r, _ := restart("0", "--steps", "6", "--save", dir, "--save-every", "3"); r.FirstStep != 1 {
		t.Fatalf("first attempt: %+v", r)
	}
	r, msg := restart("1", "--steps", "10", "--save", dir, "--save-every", "3", "--init", filepath.Join(dir, "nonexistent.safetensors"))
	if r.FirstStep != 7 || r.LossLast != full.LossLast || !strings.Contains(msg, "mlp: restart 1: resuming from "+ckpt.StepDir(dir, 6)+" at step 6") {
		t.Errorf("restart: first step %d, loss %v (uninterrupted %v), stderr %q", r.FirstStep, r.LossLast, full.LossLast, msg)
	}
	if r, msg := restart("2", "--steps", "10", "--save", t.TempDir()); r.FirstStep != 1 || r.LossLast != full.LossLast || strings.Contains(msg, "resuming") {
		t.Errorf("restart with no checkpoint yet: first step %d, loss %v, stderr %q", r.FirstStep, r.LossLast, msg)
	}
}
