package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshrun/meshrun/internal/testtime"
	"github.com/meshrun/meshrun/launch/probe"
	"github.com/meshrun/meshrun/logview"
)

// bin holds the worker and launcher binaries, built once for the package.
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "meshrun-launch-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	build := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "../cmd/worker", "../cmd/launcher", "./testdata/ranktest")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building worker, launcher and ranktest:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	bin = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func worker() string { return filepath.Join(bin, "worker") }

// launcherMain is the launcher's command line as cmd/launcher runs it: logs
// and trace are package logview's, every other command is Main's.
func launcherMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "logs":
			return logview.LogsMain(ctx, args[1:], stdout, stderr)
		case "trace":
			return logview.TraceMain(args[1:], stdout, stderr)
		}
	}
	return Main(ctx, args, stdout, stderr)
}

// launch runs `launcher run` in process with a fresh log dir and job id.
func launch(t *testing.T, args ...string) (code int, jobDir string, stdout, stderr string) {
	t.Helper()
	logDir := t.TempDir()
	id := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	full := append([]string{"run", "--worker", worker(), "--log-dir", logDir, "--job-id", id, "--grace", "2s"}, args...)
	var out, errb bytes.Buffer
	code = Main(context.Background(), full, &out, &errb)
	return code, filepath.Join(logDir, id), out.String(), errb.String()
}

func readJSON[T any](t *testing.T, path string) T {
	t.Helper()
	var v T
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

// groupGone reports whether the process group pgid has no live process left
// within a second (scaled: testtime). Zombies count as gone: a rank's
// children are reparented to init, which reaps them when it will.
func groupGone(pgid int) bool {
	deadline := time.Now().Add(testtime.Scale(time.Second))
	for groupLive(pgid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// groupLive reports whether a process of group pgid runs (not a zombie).
func groupLive(pgid int) bool {
	if errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH) {
		return false
	}
	for _, f := range probe.GroupStats(pgid) {
		if f[0] != "Z" {
			return true
		}
	}
	return false
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func TestRunHello(t *testing.T) {
	code, dir, stdout, stderr := launch(t, "-n", "4", "hello")
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr)
	}
	for r := 0; r < 4; r++ {
		want := fmt.Sprintf("0:%d| hello from rank %d of 4\n", r, r)
		if !strings.Contains(stdout, want) {
			t.Errorf("console lacks %q:\n%s", want, stdout)
		}
		b, err := os.ReadFile(filepath.Join(dir, RankDir(r), "stdout.log"))
		if err != nil {
			t.Fatal(err)
		}
		if got := string(b); !strings.HasSuffix(got, fmt.Sprintf("Z hello from rank %d of 4\n", r)) && !strings.Contains(got, fmt.Sprintf(" hello from rank %d of 4\n", r)) {
			t.Errorf("rank %d stdout.log = %q", r, got)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, RankDir(r), "log.jsonl")); !bytes.Contains(b, []byte(`"msg":"hello"`)) {
			t.Errorf("rank %d log.jsonl lacks the log line: %q", r, b)
		}
	}
	rec := readJSON[JobRecord](t, filepath.Join(dir, JobFile))
	if len(rec.Ranks) != 4 || rec.World != 4 || rec.Versions["go"] == "" || rec.Env["MESHRUN_NATS_CREDS"] == "" {
		t.Errorf("job.json: %+v", rec)
	}
	for _, r := range rec.Ranks {
		if r.PID <= 0 {
			t.Errorf("rank %d has no pid", r.Rank)
		}
	}
	if _, err := os.Stat(rec.Env["MESHRUN_NATS_CREDS"]); !os.IsNotExist(err) {
		t.Errorf("creds file left behind: %v", err)
	}
	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	if sum.ExitCode != 0 || sum.RootCauseRank != nil || sum.Reason != OutcomeOK || len(sum.Ranks) != 4 {
		t.Errorf("summary.json: %+v", sum)
	}
	ev, err := os.ReadFile(filepath.Join(dir, EventsFile))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(ev)), "\n")
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil || m["ts_ms"] == nil {
			t.Errorf("event %q: %v", l, err)
		}
	}
	if !strings.Contains(lines[0], `"job_start"`) || !strings.Contains(lines[len(lines)-1], `"job_end"`) {
		t.Errorf("events do not run from job_start to job_end:\n%s", ev)
	}
}

func TestRunRootCause(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		rank   int
		signal string
	}{
		{"exit 3", []string{"-n", "4", "exit", "3", "2"}, 3, 2, ""},
		{"SIGKILL", []string{"-n", "3", "--", "sh", "-c", `if [ "$RANK" = 1 ]; then sleep 0.2; kill -9 $$; fi; sleep 30`}, 137, 1, "SIGKILL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, dir, _, stderr := launch(t, tc.args...)
			ended := time.Now()
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tc.code, stderr)
			}
			if s := readJSON[Summary](t, filepath.Join(dir, SummaryFile)); s.RootCause != nil {
				if d := ended.Sub(time.UnixMilli(s.RootCause.TimeMS)); d > 2*time.Second+testtime.Scale(2*time.Second) {
					t.Errorf("exited %v after the failure, want within grace + 2 s", d)
				}
			}
			if !strings.Contains(stderr, fmt.Sprintf("root cause rank %d", tc.rank)) {
				t.Errorf("stderr does not name rank %d:\n%s", tc.rank, stderr)
			}
			sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
			if sum.RootCauseRank == nil || *sum.RootCauseRank != tc.rank || sum.ExitCode != tc.code {
				t.Fatalf("summary.json: %+v", sum)
			}
			if got := sum.Ranks[tc.rank].Signal; got != tc.signal {
				t.Errorf("root cause signal %q, want %q", got, tc.signal)
			}
			if len(sum.Victims) != len(sum.Ranks)-1 {
				t.Errorf("victims %v, want every other rank", sum.Victims)
			}
			for _, r := range sum.Ranks {
				if !groupGone(r.PID) {
					t.Errorf("rank %d's process group %d still has processes", r.Rank, r.PID)
				}
			}
		})
	}
}

func TestRunTimeout(t *testing.T) {
	code, dir, _, stderr := launch(t, "-n", "2", "--timeout", "300ms", "sleep", "30s")
	if code != ExitTimeout {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, ExitTimeout, stderr)
	}
	if sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile)); sum.Reason != OutcomeTimeout || sum.RootCauseRank != nil {
		t.Errorf("summary.json: %+v", sum)
	}
}

func TestRunInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	var out, errb bytes.Buffer
	code := Main(ctx, []string{"run", "--worker", worker(), "--log-dir", t.TempDir(), "-n", "2", "sleep", "30s"}, &out, &errb)
	if code != ExitInterrupted {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, ExitInterrupted, errb.String())
	}
}

// TestLauncherKilled kills the launcher with SIGKILL and expects its ranks to
// die with it.
func TestLauncherKilled(t *testing.T) {
	logDir := t.TempDir()
	cmd := exec.Command(filepath.Join(bin, "launcher"), "run", "-n", "3", "--job-id", "killed", "--log-dir", logDir, "sleep", "30s")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	jobFile := filepath.Join(logDir, "killed", JobFile)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(jobFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("job.json never appeared")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // let the write finish
	rec := readJSON[JobRecord](t, jobFile)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	deadline = time.Now().Add(3 * time.Second)
	for _, r := range rec.Ranks {
		for alive(r.PID) {
			if time.Now().After(deadline) {
				t.Fatalf("rank %d (pid %d) outlived the launcher", r.Rank, r.PID)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func TestRunBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"nproc", []string{"-n", "zero", "hello"}, []string{`--nproc-per-node "zero"`}},
		{"every problem", []string{"-n", "0", "--grace", "-1s", "--job-id", "a/b"}, []string{"--nproc-per-node", "--grace", "--job-id", "no workload"}},
		{"unknown flag", []string{"--bogus", "hello"}, []string{"bogus"}},
		{"bad duration", []string{"--timeout", "soon", "hello"}, []string{"timeout"}},
		{"empty program", []string{"--"}, []string{"no program after --"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Main(context.Background(), append([]string{"run"}, tc.args...), &out, &errb)
			if code != ExitUsage {
				t.Errorf("exit %d, want %d", code, ExitUsage)
			}
			msg := errb.String()
			if strings.Count(msg, "\n") != 1 || !strings.HasPrefix(msg, "launcher run: ") {
				t.Errorf("want one line, got %q", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q lacks %q", msg, w)
				}
			}
		})
	}
}

func TestParseRunFlags(t *testing.T) {
	env := map[string]string{"MESHRUN_NPROC_PER_NODE": "3", "MESHRUN_GRACE": "1s", "MESHRUN_DRY_RUN": "true"}
	o, err := ParseRunFlags([]string{"-n", "2", "--", "prog", "-x"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if o.NprocPerNode != "2" || o.Grace != time.Second || !o.DryRun || !o.Program || strings.Join(o.Command, " ") != "prog -x" {
		t.Errorf("flags over env, program after --: %+v", o)
	}
	o, err = ParseRunFlags([]string{"hello", "--x"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if o.NprocPerNode != "3" || o.Program || strings.Join(o.Command, " ") != "hello --x" {
		t.Errorf("env default, workload: %+v", o)
	}
	if _, err := ParseRunFlags(nil, func(k string) string {
		if k == "MESHRUN_GRACE" {
			return "forever"
		}
		return ""
	}); err == nil || !strings.Contains(err.Error(), "MESHRUN_GRACE") {
		t.Errorf("bad env value: %v", err)
	}
}

func TestRunDryRun(t *testing.T) {
	logDir := t.TempDir()
	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"run", "--dry-run", "-n", "3", "--job-id", "dry", "--log-dir", logDir, "--", "prog", "a"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if got := strings.Count(out.String(), "prog a\n"); got != 3 {
		t.Errorf("want 3 rank rows:\n%s", out.String())
	}
	if _, err := os.Stat(filepath.Join(logDir, "dry")); !os.IsNotExist(err) {
		t.Errorf("dry run created the job folder: %v", err)
	}
}

func TestRunStartFailure(t *testing.T) {
	code, dir, _, stderr := launch(t, "-n", "2", "--", filepath.Join(t.TempDir(), "missing"))
	if code != ExitStartFailed {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, ExitStartFailed, stderr)
	}
	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	if sum.RootCauseRank == nil || *sum.RootCauseRank != 0 || sum.Ranks[0].Error == "" {
		t.Errorf("summary.json: %+v", sum)
	}
	if !strings.Contains(stderr, "rank 0 did not start") {
		t.Errorf("stderr does not say which rank did not start:\n%s", stderr)
	}
}

func TestRunHelp(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Main(context.Background(), []string{"run", "-h"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "--nproc-per-node") {
		t.Errorf("exit %d, usage %q", code, out.String())
	}
}

// TestRunEnv checks what a rank sees: its variables, and a 0600 credentials
// file that is not on the command line.
func TestRunEnv(t *testing.T) {
	script := `stat -c %a "$MESHRUN_NATS_CREDS"; grep -c '^password=' "$MESHRUN_NATS_CREDS";` +
		` echo "$RANK/$LOCAL_RANK/$WORLD_SIZE/$LOCAL_WORLD_SIZE/$NODE_RANK/$NNODES/$MESHRUN_JOB_ID/$GOMAXPROCS"; echo "$MESHRUN_NATS_URL"`
	code, _, stdout, stderr := launch(t, "-n", "2", "--", "sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	// Lines every rank prints alike are collapsed.
	for _, want := range []string{"ranks[0-1]: 600\n", "ranks[0-1]: 1\n", "ranks[0-1]: nats://127.0.0.1:"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("console lacks %q:\n%s", want, stdout)
		}
	}
	for r := 0; r < 2; r++ {
		want := fmt.Sprintf("0:%d| %d/%d/2/2/0/1/TestRunEnv/", r, r, r)
		if !strings.Contains(stdout, want) {
			t.Errorf("rank %d: console lacks %q:\n%s", r, want, stdout)
		}
	}
}
