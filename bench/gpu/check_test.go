// Package gpu_test tests bench/gpu/check.sh, the one command a GPU machine
// runs, in its dry mode: the sim device, bench/gpu/fake-tools.sh for the
// GPU machine's tools. What it proves is the script's own logic — each
// step's status line, timeouts, the deadline, skipping, the archive
// rewritten after every step — not anything about a GPU.
package gpu_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// steps are check.sh's steps, in order.
var steps = []string{"probe", "ptxas", "build", "dispatch", "conformance-float32", "conformance-float64",
	"conformance-bfloat16", "conformance-fallback", "nccl", "mlp-1", "mlp-2", "verify", "gpt", "gpt-2", "gpt-bf16", "gpt-fused", "gpt-fused-bf16", "gpt-pp", "gpt-recipe", "bench"}

// run is one dry run of check.sh.
type run struct {
	out, tmp string        // its $OUT and $TMPDIR
	console  string        // stdout and stderr
	wall     time.Duration // start to exit
	summary  []string      // summary.md's lines
	status   map[string]string
	figures  map[string]string
	logs     map[string]string // gpu-logs.tgz: name (less gpu-logs/) to contents
	entries  []string          // $OUT's entries
}

// start starts check.sh --dry with args and env (besides OUT and TMPDIR,
// both fresh, and PATH; every MESHRUN_ variable of the test's environment is
// left out).
func start(t *testing.T, env []string, args ...string) (*exec.Cmd, *run, *bytes.Buffer) {
	t.Helper()
	r := &run{out: t.TempDir(), tmp: t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, "bash", append([]string{"check.sh", "--dry"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MESHRUN_") && !strings.HasPrefix(kv, "OUT=") && !strings.HasPrefix(kv, "TMPDIR=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, append([]string{"OUT=" + r.out, "TMPDIR=" + r.tmp}, env...)...)
	var console bytes.Buffer
	cmd.Stdout, cmd.Stderr = &console, &console
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, r, &console
}

// finish waits for cmd and reads what it left.
func finish(t *testing.T, cmd *exec.Cmd, r *run, console *bytes.Buffer, began time.Time) *run {
	t.Helper()
	err := cmd.Wait()
	r.wall = time.Since(began)
	r.console = console.String()
	if err != nil && !errors.As(err, new(*exec.ExitError)) {
		t.Fatalf("check.sh: %v\n%s", err, r.console)
	}
	if left := leftovers(r.tmp); len(left) > 0 {
		t.Errorf("processes left running by check.sh: %v", left)
	}
	b, err := os.ReadFile(filepath.Join(r.out, "summary.md"))
	if err != nil {
		t.Fatalf("%v\n%s", err, r.console)
	}
	r.summary = strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	r.status, r.figures = map[string]string{}, map[string]string{}
	for _, l := range r.summary {
		name, rest, ok := strings.Cut(strings.TrimPrefix(l, "- "), ": ")
		if !ok || !strings.HasPrefix(l, "- ") {
			continue
		}
		status, rest, _ := strings.Cut(rest, "; ")
		_, figs, _ := strings.Cut(rest, "; ")
		r.status[name], r.figures[name] = status, figs
	}
	r.logs = readArchive(t, filepath.Join(r.out, "gpu-logs.tgz"))
	ents, err := os.ReadDir(r.out)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		r.entries = append(r.entries, e.Name())
	}
	return r
}

// check runs check.sh --dry to its end.
func check(t *testing.T, env []string, args ...string) *run {
	t.Helper()
	began := time.Now()
	cmd, r, console := start(t, env, args...)
	return finish(t, cmd, r, console, began)
}

// readArchive reads every file of a gzipped tar: a damaged one fails the test.
func readArchive(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	files := map[string]string{}
	tr := tar.NewReader(z)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("%s: %s: %v", path, h.Name, err)
		}
		if h.Typeflag == tar.TypeReg {
			files[strings.TrimPrefix(h.Name, "gpu-logs/")] = string(b)
		}
	}
	return files
}

// leftovers: the processes whose environment holds TMPDIR=tmp (everything
// check.sh started), after up to 5 s for them to end.
func leftovers(tmp string) []string {
	want := []byte("TMPDIR=" + tmp + "\x00")
	for wait := 0; ; wait++ {
		var left []string
		procs, _ := filepath.Glob("/proc/[0-9]*/environ")
		for _, p := range procs {
			env, err := os.ReadFile(p)
			if err != nil || !bytes.Contains(env, want) {
				continue
			}
			cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
			left = append(left, fmt.Sprintf("%s (%s)", filepath.Base(filepath.Dir(p)), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		}
		if len(left) == 0 || wait == 50 {
			return left
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// expect checks the summary's step lines against status (a step's status,
// or its beginning, ending in a space, comma or colon).
func (r *run) expect(t *testing.T, status map[string]string) {
	t.Helper()
	var got []string
	for _, l := range r.summary {
		if name, _, ok := strings.Cut(strings.TrimPrefix(l, "- "), ":"); ok && slices.Contains(steps, name) {
			got = append(got, name)
		}
	}
	if !slices.Equal(got, steps) {
		t.Errorf("summary's steps %v, want one line for each of %v, in order", got, steps)
	}
	for _, s := range steps {
		want := status[s]
		if strings.ContainsAny(want[len(want)-1:], " ,:") && strings.HasPrefix(r.status[s], want) || r.status[s] == want {
			continue
		}
		t.Errorf("%s: status %q, want %q", s, r.status[s], want)
	}
	if len(r.summary) < 2 || !strings.HasPrefix(r.summary[0], "device: ") || !strings.HasPrefix(r.summary[1], "versions: ") {
		t.Errorf("summary does not begin with the device and versions lines:\n%s", strings.Join(r.summary, "\n"))
	}
	if last := r.summary[len(r.summary)-1]; !strings.HasPrefix(last, "- end: ") {
		t.Errorf("summary's last line %q, want the end line", last)
	}
	// Every step has its log in the archive, and the archive's summary is the last.
	for i, s := range steps {
		if _, ok := r.logs[fmt.Sprintf("%02d-%s.log", i+1, s)]; !ok {
			t.Errorf("gpu-logs.tgz lacks %02d-%s.log: has %v", i+1, s, r.names())
		}
	}
	if got := r.logs["summary.md"]; got != strings.Join(r.summary, "\n")+"\n" {
		t.Errorf("gpu-logs.tgz's summary.md is not the last:\n%s", got)
	}
	if !slices.Equal(r.entries, []string{"gpu-logs.tgz", "summary.md"}) {
		t.Errorf("$OUT holds %v, want gpu-logs.tgz and summary.md", r.entries)
	}
	if t.Failed() {
		t.Logf("console:\n%s", r.console)
	}
}

func (r *run) names() []string {
	var n []string
	for k := range r.logs {
		n = append(n, k)
	}
	slices.Sort(n)
	return n
}

func TestCheckDry(t *testing.T) {
	for _, tool := range []string{"bash", "tar", "gzip", "timeout"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("check.sh needs %s: %v", tool, err)
		}
	}
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("needs /proc to find what check.sh left running")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+string(filepath.Separator), "../../cmd/launcher", "../../cmd/worker")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	prebuilt := "MESHRUN_CHECK_BIN=" + bin

	// Every step runs; one fails, one hangs and is killed at its timeout
	// (3 s) and the next runs; the benchmarks, which need 150 s, are skipped
	// with 100 s to go.
	t.Run("steps", func(t *testing.T) {
		t.Parallel()
		r := check(t, []string{prebuilt, "MESHRUN_FAKE_FAIL=conformance-float64", "MESHRUN_FAKE_SLEEP=nccl=1000",
			"MESHRUN_CHECK_TIMEOUTS=nccl=3"}, "--deadline", "100")
		want := map[string]string{"nccl": "TIMEOUT after 3 s", "conformance-float64": "FAIL rc 2", "bench": "SKIPPED: needs 150 s,"}
		for _, s := range steps {
			if want[s] == "" {
				want[s] = "ok"
			}
		}
		r.expect(t, want)
		for name, figs := range map[string]string{
			"ptxas":               "65 entry functions for sm_90",
			"build":               "prebuilt",
			"conformance-float32": "8 passed, 0 failed, 0 skipped",
			"conformance-float64": "panic: cuda.test (fake) fails",
			"mlp-1":               "largest relative loss difference 0 over 5 losses (tolerance 1e-4); sim per step: h2d 0 B, d2h 8 B, staged 0 B,",
			"mlp-2":               "largest relative loss difference 0 over 5 losses (tolerance 1e-4); sim per step: h2d 0 B, d2h 8 B, staged 65536 B,",
			"verify":              "failed",
			"gpt":                 "largest relative loss difference 0 over 6 losses (tolerance 1e-4)",
			"gpt-2":               "largest relative loss difference 0 over 6 losses (tolerance 1e-4)",
			"gpt-bf16":            "largest relative loss difference 0 over 6 losses (tolerance 1e-2)",
			"gpt-fused":           "largest relative loss difference 0 over 6 losses (tolerance 1e-4)",
			"gpt-fused-bf16":      "largest relative loss difference 0 over 6 losses (tolerance 1e-2)",
			"gpt-pp":              "largest relative loss difference 0 over 6 losses (tolerance 1e-4)",
			"gpt-recipe":          "largest relative loss difference 0 over 6 losses (tolerance 1e-4)",
		} {
			if !strings.Contains(r.figures[name], figs) {
				t.Errorf("%s: figures %q, want %q in them", name, r.figures[name], figs)
			}
		}
		if !strings.Contains(r.figures["verify"], ", 0 failed") {
			t.Errorf("verify: figures %q", r.figures["verify"])
		}
		for _, l := range []string{"10-mlp-1.sim.log", "10-mlp-1.cpu.log", "11-mlp-2.sim.log", "13-gpt.cpu.log"} {
			if !strings.Contains(r.logs[l], "0:0| step 3/3 loss") {
				t.Errorf("%s: no losses:\n%s", l, r.logs[l])
			}
		}
		if !strings.Contains(r.logs["11-mlp-2.log"], "MESHRUN_COLLECTIVES=staged") {
			t.Errorf("11-mlp-2.log: the two ranks' run is not staged:\n%s", r.logs["11-mlp-2.log"])
		}
	})

	// With 20 s, the first step hangs until the deadline less its margins
	// (10 s: SIGKILL 5 s after SIGTERM, 5 s for the last line and archive),
	// every other step is skipped with the reason, and the run ends in time.
	t.Run("deadline", func(t *testing.T) {
		t.Parallel()
		r := check(t, []string{prebuilt, "MESHRUN_FAKE_SLEEP=probe=1000"}, "--deadline", "20")
		want := map[string]string{"probe": "TIMEOUT after "}
		for _, s := range steps[1:] {
			want[s] = "SKIPPED: needs "
		}
		r.expect(t, want)
		// 10 s, or 9 where the machine's load held the script's start back
		// past a second.
		if st := r.status["probe"]; st != "TIMEOUT after 10 s" && st != "TIMEOUT after 9 s" {
			t.Errorf("probe: %q, want a timeout after 10 s (9 under load)", st)
		}
		for _, s := range steps[1:] {
			if !strings.HasSuffix(r.status[s], " s left") {
				t.Errorf("%s: %q gives no reason", s, r.status[s])
			}
		}
		if r.wall > 23*time.Second {
			t.Errorf("a run with a 20 s deadline took %v", r.wall)
		}
	})

	// The benchmarks run with 150 s or more to go (here against the fake
	// PyTorch and the sim worker), after the build step builds what is
	// missing; steps listed in MESHRUN_CHECK_SKIP are skipped.
	t.Run("bench", func(t *testing.T) {
		t.Parallel()
		skip := "ptxas dispatch conformance-float32 conformance-float64 conformance-bfloat16 conformance-fallback nccl mlp-1 mlp-2 verify gpt gpt-2 gpt-bf16 gpt-fused gpt-fused-bf16 gpt-pp gpt-recipe"
		r := check(t, []string{"MESHRUN_CHECK_SKIP=" + skip})
		want := map[string]string{"probe": "ok", "build": "ok", "bench": "ok"}
		for _, s := range strings.Fields(skip) {
			want[s] = "SKIPPED: listed in MESHRUN_CHECK_SKIP"
		}
		r.expect(t, want)
		if !strings.HasPrefix(r.figures["build"], "built by go build") {
			t.Errorf("build: figures %q, want the build", r.figures["build"])
		}
		if f := r.figures["bench"]; !strings.Contains(f, "linear meshrun/PyTorch over 28 rows: min 1.00, median 1.00, max 1.00") || strings.Contains(f, "failed") {
			t.Errorf("bench: figures %q", f)
		}
	})

	// SIGTERM mid-step: the step's processes are stopped, the summary says
	// so and the archive holds every log so far.
	t.Run("killed", func(t *testing.T) {
		t.Parallel()
		began := time.Now()
		cmd, r, console := start(t, []string{prebuilt, "MESHRUN_FAKE_SLEEP=nccl=1000"}, "--deadline", "100")
		for !strings.Contains(readFile(filepath.Join(r.out, "summary.md")), "- conformance-bfloat16: ") {
			if time.Since(began) > 60*time.Second {
				t.Fatalf("no line for conformance-bfloat16 after 60 s:\n%s", console)
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		r = finish(t, cmd, r, console, began)
		if last := r.summary[len(r.summary)-1]; !strings.HasPrefix(last, "- check.sh: killed by SIGTERM") {
			t.Errorf("summary's last line %q", last)
		}
		if _, ok := r.logs["09-nccl.log"]; !ok {
			t.Errorf("gpu-logs.tgz lacks the log of the step killed: %v", r.names())
		}
		if r.wall > 10*time.Second {
			t.Errorf("killed run took %v", r.wall)
		}
	})
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
