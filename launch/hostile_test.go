package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshrun/meshrun/internal/testtime"
	"github.com/meshrun/meshrun/logview"
)

// TestRootCauseFromEvidence: rank 1 of 3 is SIGTERMed, SIGSTOPped, or exits 0
// before joining; every run names rank 1 as the root cause in the console's
// last line, summary.json and logs why, and never lists it among the
// victims, whichever rank's exit the launcher saw first. A SIGTERMed worker
// exits 143; a SIGSTOPped one is hung (exit 125: its peers' heartbeat
// timeout finds it, they fail blaming it and exit first), and still is when
// it is SIGCONTed as soon as the teardown begins, before the launcher's own
// SIGTERM: it stopped answering, whatever it does once resumed; a rank that
// leaves before joining ends the job at once (exit 1), not at the rendezvous
// deadline.
func TestRootCauseFromEvidence(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 7 jobs")
	}
	long := []string{"-n", "3", "mlp", "--tokens", "64", "--hidden", "64", "--steps", "1000000"}
	sigterm := func(t *testing.T, dir string, pid int) { syscall.Kill(pid, syscall.SIGTERM) }
	cases := []struct {
		name  string
		args  []string
		act   func(t *testing.T, dir string, pid int) // done to rank 1 once the job trains
		code  int
		hung  bool
		bound time.Duration // from the act to the launcher's exit
	}{
		{"SIGTERM", long, sigterm, 143, false, 10 * time.Second},
		{"SIGTERM again", long, sigterm, 143, false, 10 * time.Second},
		{"SIGTERM a third time", long, sigterm, 143, false, 10 * time.Second},
		// With --hang-after off the peers' heartbeat timeout (5 s) finds it.
		{"SIGSTOP", append([]string{"--hang-after", "0"}, long...), func(t *testing.T, dir string, pid int) { syscall.Kill(pid, syscall.SIGSTOP) }, ExitHang, true, 20 * time.Second},
		{"SIGSTOP then SIGCONT", append([]string{"--hang-after", "0"}, long...), func(t *testing.T, dir string, pid int) {
			syscall.Kill(pid, syscall.SIGSTOP)
			// Past the peers' heartbeat timeout: a peer failed and the
			// teardown began; resumed before the launcher's SIGTERM.
			waitFor(t, 30*time.Second, "the teardown", func() bool {
				b, _ := os.ReadFile(filepath.Join(dir, EventsFile))
				return bytes.Contains(b, []byte(`"event":"teardown"`))
			})
			syscall.Kill(pid, syscall.SIGCONT)
		}, ExitHang, true, 20 * time.Second},
		{"exit 0 before joining", []string{"-n", "3", "--", "sh", "-c", `if [ "$RANK" = 1 ]; then exit 0; fi; exec "$0" barrier`, worker()}, nil, 1, false, 10 * time.Second},
		{"exit 0 before joining again", []string{"-n", "3", "--", "sh", "-c", `if [ "$RANK" = 1 ]; then exit 0; fi; exec "$0" barrier`, worker()}, nil, 1, false, 10 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			job := strings.ReplaceAll(tc.name, " ", "-")
			l := startLauncher(t, append([]string{"--job-id", job}, tc.args...)...)
			dir := filepath.Join(l.dir, job)
			acted := time.Now()
			if tc.act != nil {
				rec := waitJobRecord(t, dir)
				waitFor(t, 30*time.Second, "training", func() bool {
					b, _ := os.ReadFile(filepath.Join(dir, RankDir(0), "stdout.log"))
					return bytes.Contains(b, []byte("step 20/"))
				})
				acted = time.Now()
				tc.act(t, dir, rec.Ranks[1].PID)
			}
			bound := testtime.Scale(tc.bound)
			l.wait(t, bound+10*time.Second)
			took := l.end.Sub(acted)
			sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
			rc := sum.RootCause
			stderr := l.err.String()
			t.Logf("exit %d after %v: %s", l.code, took.Round(time.Millisecond), finalLine(stderr))
			if rc == nil || rc.Rank != 1 || slices.Contains(sum.Victims, 1) {
				t.Fatalf("root cause %+v, victims %v\n%s", rc, sum.Victims, stderr)
			}
			if l.code != tc.code || exitCodeOf(rc) != tc.code {
				t.Errorf("exit %d, root cause's exit %d, want %d", l.code, rc.ExitCode, tc.code)
			}
			if rc.Hung != tc.hung {
				t.Errorf("root cause hung %v, want %v: %+v", rc.Hung, tc.hung, rc)
			}
			if tc.hung && (sum.Reason != OutcomeHang || !strings.Contains(rc.Error, "stopped answering its peers") || !strings.Contains(rc.Error, "its process was T (stopped)")) {
				t.Errorf("reason %s, error %q: want a hang, stopped answering, its process T (stopped)", sum.Reason, rc.Error)
			}
			if !strings.Contains(finalLine(stderr), "root cause rank 1 ") {
				t.Errorf("console's last line: %s", finalLine(stderr))
			}
			var why bytes.Buffer
			if err := logview.Why(dir, &why); err != nil || !strings.Contains(why.String(), "root cause: rank 1 on node 0") {
				t.Errorf("logs why: %v\n%s", err, why.String())
			}
			if took > bound {
				t.Errorf("ended %v after, want < %v", took, bound)
			}
		})
	}
}

// TestRootCauseByVotes: the culprit's own exit is seen last, on purpose, so
// that only the votes can name it. Rank 1 of 3 records its failure, closes
// its world and lingers until the teardown's SIGTERM before it exits 3
// (ranktest -linger): ranks 0 and 2 fail on it ("peer lost: rank 1") and
// exit first, one of them starting the teardown. The root cause is rank 1
// all the same, with its own exit code and error, not hung, reported by the
// rank that failed first, blamed by both; the launcher exits 3.
func TestRootCauseByVotes(t *testing.T) {
	code, dir, _, stderr := launch(t, "-n", "3", "--", ranktest(), "-steps", "0", "-fail-rank", "1", "-fail-code", "3", "-at", "5", "-linger")
	t.Logf("exit %d: %s", code, finalLine(stderr))

	// The premise: a peer's exit came first and started the teardown; rank
	// 1 exited only after it.
	var exits []int
	teardown, rank1Exit := -1, -1
	b, err := os.ReadFile(filepath.Join(dir, EventsFile))
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var e struct {
			Event string `json:"event"`
			Rank  int    `json:"rank"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events.jsonl: %q: %v", line, err)
		}
		switch e.Event {
		case "rank_exit":
			exits = append(exits, e.Rank)
			if e.Rank == 1 {
				rank1Exit = i
			}
		case "teardown":
			if teardown < 0 {
				teardown = i
			}
		}
	}
	if len(exits) != 3 || exits[0] == 1 || teardown < 0 || rank1Exit < teardown {
		t.Fatalf("exits in order %v, teardown at event %d, rank 1's exit at event %d: the peers did not exit first\n%s", exits, teardown, rank1Exit, stderr)
	}

	if code != 3 {
		t.Errorf("exit %d, want 3 (rank 1's)", code)
	}
	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	rc := sum.RootCause
	if rc == nil || rc.Rank != 1 || rc.ExitCode != 3 || rc.Hung || rc.Error != "injected failure" || sum.Reason != OutcomeRankFailed {
		t.Fatalf("reason %s, root cause %+v\n%s", sum.Reason, rc, stderr)
	}
	if want := evidenceBlamed + " (ranks 0,2 blame it)"; rc.Evidence != want {
		t.Errorf("evidence %q, want %q", rc.Evidence, want)
	}
	if rc.ReportedBy == nil || *rc.ReportedBy != exits[0] {
		t.Errorf("reported by %v, want rank %d (the first exit)", rc.ReportedBy, exits[0])
	}
	if fmt.Sprint(sum.Victims) != "[0 2]" {
		t.Errorf("victims %v, want [0 2]", sum.Victims)
	}
	last := finalLine(stderr)
	for _, want := range []string{"rank failed: root cause rank 1 (node 0, pid ", ") exited with code 3 at ",
		fmt.Sprintf("(blamed by the failed ranks' errors (ranks 0,2 blame it); rank %d failed first); 2 other ranks torn down", exits[0])} {
		if !strings.Contains(last, want) {
			t.Errorf("console's last line lacks %q: %s", want, last)
		}
	}
	var why bytes.Buffer
	if err := logview.Why(dir, &why); err != nil || !strings.Contains(why.String(), "root cause: rank 1 on node 0 exited with code 3") ||
		!strings.Contains(why.String(), "victims (torn down, not the cause): ranks 0,2") {
		t.Errorf("logs why: %v\n%s", err, why.String())
	}
}

// finalLine is s's last non-empty line.
func finalLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// TestNNodesZero: --nnodes 0 (and 0:0, and the variable) is refused.
func TestNNodesZero(t *testing.T) {
	for _, args := range [][]string{{"--nnodes", "0", "hello"}, {"--nnodes=0:0", "hello"}, {"--nnodes", "-1", "hello"}} {
		if _, err := ParseRunFlags(args, func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "want 1 or more nodes") {
			t.Errorf("%v: %v", args, err)
		}
	}
	env := func(k string) string { return map[string]string{"MESHRUN_NNODES": "0"}[k] }
	if _, err := ParseRunFlags([]string{"hello"}, env); err == nil {
		t.Error("MESHRUN_NNODES=0 accepted")
	}
	var out, errb bytes.Buffer
	if code := Main(context.Background(), []string{"run", "--nnodes", "0", "--dry-run", "hello"}, &out, &errb); code != ExitUsage {
		t.Errorf("exit %d: %s", code, errb.String())
	}
}

// TestTooManyRanks: -n 10000 is refused before anything starts, naming every
// limit it is over (exit 2, no job folder); --oversubscribe goes past them.
func TestTooManyRanks(t *testing.T) {
	l := hostLimits{cores: 2, memory: 8 << 30, files: 1024, procs: 4096}
	p := resourceProblems(10000, true, l)
	want := []string{"over 64 per core (128 at most here)", "open files, the limit is 1024", "over half the process limit", "need at least 195.3 GiB"}
	if len(p) != len(want) {
		t.Fatalf("problems %q", p)
	}
	for i, w := range want {
		if !strings.Contains(p[i], w) {
			t.Errorf("%q lacks %q", p[i], w)
		}
	}
	if p := resourceProblems(100, false, l); len(p) != 0 {
		t.Errorf("100 program ranks: %q", p)
	}
	if p := resourceProblems(8, true, hostLimits{cores: 1}); len(p) != 0 {
		t.Errorf("unknown limits: %q", p)
	}

	start := time.Now()
	code, dir, stdout, stderr := launch(t, "-n", "10000", "linear")
	if code != ExitUsage || !strings.Contains(stderr, "--nproc-per-node 10000: 10000 ranks on ") || !strings.Contains(stderr, "--oversubscribe runs it anyway") || stdout != "" {
		t.Errorf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("a job folder: %v", err)
	}
	t.Logf("refused in %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(stderr))
	if code, _, _, stderr := launch(t, "--oversubscribe", "--dry-run", "-n", "300", "--", "true"); code != 0 {
		t.Errorf("--oversubscribe: exit %d: %s", code, stderr)
	}
}

// TestInterruptWhileSpawning: the launcher honours an interrupt while it
// starts ranks: it stops starting them and ends at once (exit 130), every
// started rank torn down.
func TestInterruptWhileSpawning(t *testing.T) {
	l := startLauncher(t, "--job-id", "spawning", "--oversubscribe", "-n", "400", "--grace", "1s", "--", "sleep", "30")
	l.waitEvent(t, "spawning", "rank_start")
	l.cancel()
	start := time.Now()
	l.wait(t, 20*time.Second)
	sum := readJSON[Summary](t, filepath.Join(l.dir, "spawning", SummaryFile))
	started := 0
	for _, r := range sum.Ranks {
		if r.PID > 0 {
			started++
			if !groupGone(r.PID) {
				t.Errorf("rank %d (pid %d) survived", r.Rank, r.PID)
			}
		}
	}
	t.Logf("interrupted after %d of 400 ranks started; exit %d after %v", started, l.code, time.Since(start).Round(time.Millisecond))
	if l.code != ExitInterrupted || started == 400 {
		t.Errorf("exit %d, %d ranks started", l.code, started)
	}
}

// TestNoOrphans: what a rank starts ends with the job, in its process group
// or not (setsid), with the launcher's tag in its environment or not (env
// -u: only the group's signal reaches it): when the launcher ends normally,
// and when it is SIGKILLed (the guard); the embedded server's credentials go
// too, and those a killed launcher left are removed at the next start.
func TestNoOrphans(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid")
	}
	script := `sleep 300 & echo $! > "$MESHRUN_RANK_DIR/child"; setsid sleep 301 & echo $! > "$MESHRUN_RANK_DIR/escaper"; ` +
		`env -u ` + EnvLauncherTag + ` sleep 302 & echo $! > "$MESHRUN_RANK_DIR/untagged"; ` +
		`if [ "$EXIT_AT_ONCE" = 1 ]; then exit 0; fi; wait`
	pids := func(dir string) []int {
		var out []int
		for r := 0; r < 2; r++ {
			for _, f := range []string{"child", "escaper", "untagged"} {
				b, err := os.ReadFile(filepath.Join(dir, RankDir(r), f))
				if err != nil {
					return nil
				}
				pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
				out = append(out, pid)
			}
		}
		return out
	}
	gone := func(t *testing.T, what string, ps []int) {
		t.Helper()
		t.Cleanup(func() { // what a failed check left, not for the next tests to meet
			for _, p := range ps {
				syscall.Kill(p, syscall.SIGKILL)
			}
		})
		waitFor(t, 5*time.Second, what+" gone", func() bool {
			for _, p := range ps {
				if processAlive(p) {
					return false
				}
			}
			return true
		})
	}

	t.Run("normal end", func(t *testing.T) {
		t.Setenv("EXIT_AT_ONCE", "1")
		code, dir, _, stderr := launch(t, "-n", "2", "--", "sh", "-c", script)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, stderr)
		}
		ps := pids(dir)
		if len(ps) != 6 {
			t.Fatalf("pids %v", ps)
		}
		gone(t, "the ranks' children", ps)
	})

	t.Run("launcher SIGKILLed", func(t *testing.T) {
		logDir := t.TempDir()
		cmd := exec.Command(filepath.Join(bin, "launcher"), "run", "--log-dir", logDir, "--job-id", "killed", "-n", "2", "--", "sh", "-c", script)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(logDir, "killed")
		var ps []int
		waitFor(t, 20*time.Second, "the ranks' children", func() bool { ps = pids(dir); return ps != nil })
		creds := filepath.Join(dir, CredsFile)
		if _, err := os.Stat(creds); err != nil {
			t.Fatalf("no credentials while the job runs: %v", err)
		}
		cmd.Process.Kill()
		cmd.Wait()
		gone(t, "the ranks' children after the launcher's SIGKILL", ps)
		waitFor(t, 5*time.Second, "the credentials removed", func() bool { _, err := os.Stat(creds); return os.IsNotExist(err) })

		// A killed launcher's credentials that survived (the guard killed
		// too) are removed when the next job starts in the same --log-dir.
		stale := filepath.Join(logDir, "stale")
		os.MkdirAll(stale, 0o755)
		os.WriteFile(filepath.Join(stale, EventsFile), []byte(fmt.Sprintf(`{"event":"job_start","launcher_pid":%d}`+"\n", cmd.Process.Pid)), 0o644)
		os.WriteFile(filepath.Join(stale, CredsFile), []byte("user=x\npassword=y\n"), 0o600)
		var out, errb bytes.Buffer
		if code := Main(context.Background(), []string{"run", "--worker", worker(), "--log-dir", logDir, "-n", "1", "hello"}, &out, &errb); code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		if _, err := os.Stat(filepath.Join(stale, CredsFile)); !os.IsNotExist(err) {
			t.Errorf("stale credentials left: %v", err)
		}
	})
}

// TestDiskFull: the ranks fill the disk of the log folder mid-job (a 2 MiB
// tmpfs): each rank's log file says so once on the console and counts the
// lines it could not keep, the job still ends as its ranks did, and
// summary.json is whole (written through a reserve and a rename), so that
// logs why reads it.
func TestDiskFull(t *testing.T) {
	logDir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", logDir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small tmpfs here (needs root): %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", logDir).Run() })
	script := `i=0; while [ $i -lt 30000 ]; do echo "line $i of a rank that says a lot, and then some more"; i=$((i+1)); done`
	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"run", "--log-dir", logDir, "--job-id", "full", "--redirects", "3", "-n", "2", "--", "sh", "-c", script}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, errb.String())
	}
	sum := readJSON[Summary](t, filepath.Join(logDir, "full", SummaryFile))
	var dropped int64
	for _, r := range sum.Ranks {
		dropped += r.LogLinesDropped
	}
	console := out.String() + errb.String()
	notes := strings.Count(console, "dropping its lines from the file")
	t.Logf("%d lines dropped, %d console notes; console:\n%s", dropped, notes, console)
	if dropped == 0 || notes < 1 || notes > 4 || strings.Count(console, "\n") > 8 {
		t.Errorf("dropped %d, notes %d", dropped, notes)
	}
	var why bytes.Buffer
	if err := logview.Why(filepath.Join(logDir, "full"), &why); err != nil || !strings.Contains(why.String(), "every rank exited 0") {
		t.Errorf("logs why: %v\n%s", err, why.String())
	}
	if _, err := os.Stat(filepath.Join(logDir, "full", reserveFile)); !os.IsNotExist(err) {
		t.Errorf("the reserve is left: %v", err)
	}
}
