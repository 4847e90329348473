package launch

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/kernels/providers/catalog"
)

// TestRunChecksWorkload: a workload's arguments are checked once, by the
// worker in check mode, before any rank starts: a misspelt flag, a mesh that
// does not match -n, a bad dtype or a provider this build lacks exit 2 with
// one line naming the flag, and leave no job folder (no rank started); a dry
// run refuses them too. Good arguments still run.
func TestRunChecksWorkload(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"typo", []string{"-n", "2", "mlp", "--tokns", "5"}, []string{"worker mlp: unknown flag --tokns; did you mean --tokens?", "worker mlp -h"}},
		{"mesh", []string{"-n", "2", "mlp", "--mesh", "dp=2,tp=2"}, []string{"worker mlp:", "mesh dp=2,tp=2", "world size is 2"}},
		{"dtype", []string{"-n", "2", "mlp", "--dtype", "fp8"}, []string{`worker mlp: --dtype "fp8": want float32 or bfloat16`}},
		{"shape", []string{"-n", "2", "linear", "--mesh", "2", "--x", "8x16:[S(0)]", "--w", "32x15:[S(0)]"}, []string{"worker linear:", "shape mismatch"}},
		{"resume", []string{"-n", "2", "mlp", "--resume", filepath.Join(t.TempDir(), "missing")}, []string{"worker mlp: --resume"}},
		{"unknown workload", []string{"-n", "2", "mpl"}, []string{`worker: unknown workload "mpl"`}},
		{"dry run", []string{"--dry-run", "-n", "2", "mlp", "--tokns", "5"}, []string{"unknown flag --tokns"}},
	}
	for _, name := range []string{"openblas", "cuda"} {
		if !catalog.Compiled(name) {
			cases = append(cases, struct {
				name string
				args []string
				want []string
			}{"kernels " + name, []string{"-n", "2", "mlp", "--kernels", name}, []string{"worker mlp: --kernels " + name, "go build -tags " + name}})
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, dir, stdout, stderr := launch(t, tc.args...)
			if code != ExitUsage {
				t.Fatalf("exit %d, want %d; stdout %q stderr %q", code, ExitUsage, stdout, stderr)
			}
			if strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "launcher run: ") {
				t.Errorf("want one line, got %q", stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("%q lacks %q", stderr, w)
				}
			}
			if stdout != "" {
				t.Errorf("stdout %q", stdout)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("the refused job left its folder: %v", err)
			}
		})
	}
	t.Run("good", func(t *testing.T) {
		code, dir, _, stderr := launch(t, "-n", "2", "mlp", "--tokens", "16", "--hidden", "8", "--steps", "2")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		if _, err := os.Stat(filepath.Join(dir, SummaryFile)); err != nil {
			t.Error(err)
		}
	})
}

// TestCheckWorkloadError: the check's error wraps ErrInvalid, and the
// environment is rank 0's with the check on and no rank folder.
func TestCheckWorkloadError(t *testing.T) {
	o := RunOptions{NprocPerNode: "3", Worker: worker(), Command: []string{"mlp", "--mesh", "tp=2"}, Stderr: &bytes.Buffer{}}
	j, err := o.resolve()
	if err != nil {
		t.Fatal(err)
	}
	err = j.checkWorkload()
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "world size is 3") {
		t.Errorf("checkWorkload: %v", err)
	}
	env := strings.Join(j.checkEnv(), "\n") + "\n"
	for _, want := range []string{"\nWORLD_SIZE=3\n", "\nRANK=0\n", "\nLOCAL_RANK=0\n", "\n" + EnvCheck + "=1\n", "\nMESHRUN_RANK_DIR=\n", "\nMESHRUN_DEVICE=cpu\n"} {
		if !strings.Contains("\n"+env, want) {
			t.Errorf("the check's environment lacks %q", strings.TrimSpace(want))
		}
	}
	// A program is not the worker: not checked.
	o = RunOptions{NprocPerNode: "2", Program: true, Command: []string{"false"}}
	if j, err = o.resolve(); err != nil {
		t.Fatal(err)
	}
	if err := j.checkWorkload(); err != nil {
		t.Errorf("a program was checked: %v", err)
	}
}
