package launch

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshrun/meshrun/logview"
	"github.com/meshrun/meshrun/runlog"
)

// TestRankCrashes: a rank's Go runtime crashes (ranktest -crash) or a
// signal kills a rank: the launcher's exit code, summary.json's root cause
// and the console's last line say which (a panic or fatal error 126, a
// crash on SIGSEGV and a kill by it 139, never the runtime's own 2; a panic
// under GOTRACEBACK=crash, after which the runtime dies by SIGABRT, 134), and
// `logs why` leads with the panic or fatal line and the crashing
// goroutine's frames, not the registers the report ends with.
func TestRankCrashes(t *testing.T) {
	rt := func(kind string) []string {
		return []string{"-n", "3", "--", ranktest(), "-steps", "0", "-crash-rank", "1", "-crash", kind, "-at", "5"}
	}
	cases := []struct {
		name   string
		args   []string
		kill   syscall.Signal // sent to rank 1 once it runs, from outside
		env    string         // GOTRACEBACK
		code   int
		crash  string // root_cause.crash
		signal string
		line   string // root_cause.error's start
		frame  string // a frame of the crashing goroutine
	}{
		{"panic", rt("panic"), 0, "", ExitCrash, "panic", "", "panic: injected panic at step 5", "main.crash.func1()"},
		// The runtime dies by SIGABRT after its report (no core file).
		{"panic under GOTRACEBACK crash", []string{"-n", "3", "--", "sh", "-c", `ulimit -c 0; exec "$0" "$@"`, ranktest(), "-steps", "0", "-crash-rank", "1", "-crash", "panic", "-at", "5"},
			0, "crash", 134, "panic", "SIGABRT", "panic: injected panic at step 5", "main.crash.func1()"},
		{"nil dereference", rt("nil"), 0, "", 139, "panic", "SIGSEGV", "panic: runtime error: invalid memory address or nil pointer dereference [signal SIGSEGV: segmentation violation", "main.crash("},
		{"concurrent map writes", rt("fatal"), 0, "", ExitCrash, "fatal error", "", "fatal error: concurrent map writes", "main.crash.func2()"},
		{"raises SIGSEGV", rt("segv"), 0, "", 139, "SIGSEGV", "SIGSEGV", "SIGSEGV: segmentation violation (sent by kill, not a fault: sigcode=", "main.crash("},
		{"kill -SEGV", []string{"-n", "3", "--", ranktest(), "-steps", "0"}, syscall.SIGSEGV, "", 139, "SIGSEGV", "SIGSEGV", "SIGSEGV: segmentation violation (sent by kill, not a fault: sigcode=0)", "goroutine "},
		// Not a Go program: the signal kills it, no report.
		{"kill -SEGV of a shell", []string{"-n", "2", "--", "sh", "-c", `if [ "$RANK" = 1 ]; then kill -SEGV $$; fi; sleep 30`}, 0, "", 139, "", "SIGSEGV", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("GOTRACEBACK", tc.env)
			}
			var (
				code        int
				dir, stderr string
			)
			if tc.kill != 0 {
				job := strings.ReplaceAll(tc.name, " ", "-")
				l := startLauncher(t, append([]string{"--job-id", job}, tc.args...)...)
				dir = filepath.Join(l.dir, job)
				rec := waitJobRecord(t, dir)
				waitFor(t, 30*time.Second, "barriers", func() bool {
					b, _ := os.ReadFile(filepath.Join(dir, RankDir(1), "stdout.log"))
					return bytes.Count(b, []byte("@meshrun:progress")) >= 3
				})
				syscall.Kill(rec.Ranks[1].PID, tc.kill)
				l.wait(t, 20*time.Second)
				code, stderr = l.code, l.err.String()
			} else {
				code, dir, _, stderr = launch(t, tc.args...)
			}
			last := finalLine(stderr)
			t.Logf("exit %d: %s", code, last)
			sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
			rc := sum.RootCause
			if rc == nil || rc.Rank != 1 || rc.Hung || sum.Reason != OutcomeRankFailed {
				t.Fatalf("reason %s, root cause %+v\n%s", sum.Reason, rc, stderr)
			}
			if code != tc.code || sum.ExitCode != tc.code || rc.ExitCode != tc.code {
				t.Errorf("exit %d, summary's %d, root cause's %d; want %d", code, sum.ExitCode, rc.ExitCode, tc.code)
			}
			if rc.Crash != tc.crash || rc.Signal != tc.signal || !strings.HasPrefix(rc.Error, tc.line) {
				t.Errorf("root cause crash %q signal %q error %q; want %q %q %q", rc.Crash, rc.Signal, rc.Error, tc.crash, tc.signal, tc.line)
			}
			var r1 RankOutcome
			for _, r := range sum.Ranks {
				if r.Rank == 1 {
					r1 = r
				}
			}
			if tc.crash != "" && tc.env == "" && (r1.ExitCode != 2 || r1.Signal != "" || r1.Crash != tc.crash) {
				t.Errorf("rank 1's own outcome %+v: want exit 2 (the runtime's), crash %q", r1, tc.crash)
			}
			if tc.env != "" && (r1.ExitCode != tc.code || r1.Signal != tc.signal || r1.Crash != tc.crash) {
				t.Errorf("rank 1's own outcome %+v: want killed by %s, crash %q", r1, tc.signal, tc.crash)
			}
			if tc.crash == "" && (r1.ExitCode != 139 || r1.Signal != "SIGSEGV" || r1.Crash != "") {
				t.Errorf("rank 1's own outcome %+v: want killed by SIGSEGV, no crash", r1)
			}
			if !strings.Contains(last, "root cause rank 1 ") || !strings.Contains(last, rc.How()) || !strings.Contains(last, tc.line) {
				t.Errorf("console's last line %q lacks %q or %q", last, rc.How(), tc.line)
			}

			var b bytes.Buffer
			if err := logview.Why(dir, &b); err != nil {
				t.Fatal(err)
			}
			why := b.String()
			lines := strings.Split(why, "\n")
			i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "root cause: rank 1 on node 0 ") })
			if i < 0 || !strings.Contains(lines[i], rc.How()) {
				t.Fatalf("logs why has no root cause line saying %q:\n%s", rc.How(), why)
			}
			if tc.crash == "" {
				if strings.Contains(why, "crashed") {
					t.Errorf("logs why calls a kill a crash:\n%s", why)
				}
				return
			}
			// The line, then the crashing goroutine and its frames, right
			// after the root cause.
			if len(lines) < i+4 || !strings.HasPrefix(lines[i+1], "  error: "+tc.line) || !(strings.HasPrefix(lines[i+2], "  crashed in goroutine ") || strings.HasPrefix(lines[i+2], "  when it crashed: goroutine ") && tc.crash == "SIGSEGV") ||
				!strings.Contains(strings.Join(lines[i+2:i+2+len(rc.Stack)], "\n"), tc.frame) {
				t.Errorf("logs why does not lead with %q and the goroutine's frames (%q):\n%s", tc.line, tc.frame, why)
			}
			if strings.Contains(why, "rax ") || strings.Contains(why, "rip ") {
				t.Errorf("logs why shows the registers:\n%s", why)
			}
			if j := strings.Index(why, "last lines of rank 1 before its crash report:"); j < 0 {
				t.Errorf("logs why has no last lines before the report:\n%s", why)
			} else if tail := why[j:]; strings.Contains(tail[:strings.Index(tail+"\n\n", "\n\n")], "goroutine ") {
				t.Errorf("the last lines are the report's:\n%s", tail)
			}
		})
	}
}

// TestRootCauseLateCrash: rank 1 of 3 closes its world at step 5 and
// crashes, or SIGKILLs itself, only once the teardown began (ranktest
// -late): its peers failed on it and exited first, one of them starting the
// teardown, so that rank 1 is still running at the teardown, as a victim
// whose own exit comes later. Its crash or the SIGKILL the launcher never
// sent is its own failure, not the teardown's doing: the root cause is rank
// 1 with its crash and code (by the peers' votes), neither hung nor a
// victim.
func TestRootCauseLateCrash(t *testing.T) {
	cases := []struct {
		name, crash, signal string
		args                []string
		code                int
	}{
		{"panic", "panic", "", []string{"-crash-rank", "1", "-crash", "panic"}, ExitCrash},
		{"nil dereference", "panic", "SIGSEGV", []string{"-crash-rank", "1", "-crash", "nil"}, 139},
		{"SIGKILL", "", "SIGKILL", []string{"-kill-rank", "1"}, 137},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, dir, _, stderr := launch(t, append([]string{"-n", "3", "--", ranktest(), "-steps", "0", "-at", "5", "-late"}, tc.args...)...)
			t.Logf("exit %d: %s", code, finalLine(stderr))
			// The premise: the teardown began before rank 1's exit.
			b, err := os.ReadFile(filepath.Join(dir, EventsFile))
			if err != nil {
				t.Fatal(err)
			}
			teardown, exit1 := -1, -1
			for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				var e struct {
					Event string `json:"event"`
					Rank  int    `json:"rank"`
				}
				json.Unmarshal([]byte(line), &e)
				if e.Event == "teardown" && teardown < 0 {
					teardown = i
				}
				if e.Event == "rank_exit" && e.Rank == 1 {
					exit1 = i
				}
			}
			if teardown < 0 || exit1 < teardown {
				t.Fatalf("rank 1 exited before the teardown began:\n%s", b)
			}
			sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
			rc := sum.RootCause
			if rc == nil || rc.Rank != 1 || rc.Hung || sum.Reason != OutcomeRankFailed || slices.Contains(sum.Victims, 1) ||
				rc.Crash != tc.crash || rc.Signal != tc.signal || !strings.HasPrefix(rc.Evidence, evidenceBlamed) {
				t.Fatalf("reason %s, victims %v, root cause %+v\n%s", sum.Reason, sum.Victims, rc, stderr)
			}
			if code != tc.code || rc.ExitCode != tc.code {
				t.Errorf("exit %d, root cause's %d, want %d", code, rc.ExitCode, tc.code)
			}
		})
	}
}

// TestBlameOwnEnd: a blamed rank still running when the teardown began,
// whose records say nothing of its own (the abort's error, after the
// teardown began), is hung, unless its end was its own: a crash report, or
// a signal the teardown had not sent (SIGKILL before the teardown's SIGKILL,
// SIGTERM before its SIGTERM, SIGSEGV whenever). Then it is the root cause
// with its crash or signal and code.
func TestBlameOwnEnd(t *testing.T) {
	tear := time.UnixMilli(1_000_000)
	term, kill := tear.Add(abortSettle), tear.Add(abortSettle+2*time.Second)
	panicked := &logview.CrashReport{Kind: logview.CrashPanic, Line: "panic: boom", Stack: []string{"goroutine 1 [running]:", "main.main()"}}
	for _, tc := range []struct {
		name    string
		code    int
		signal  string
		endMS   int64
		crashed *logview.CrashReport
		termAt  time.Time // when the teardown sent SIGTERM; zero: not yet
		killAt  time.Time
		want    int // the root cause's exit code; ExitHang: hung
		crash   string
	}{
		{"crashed after the teardown began", 2, "", term.UnixMilli() - 100, panicked, time.Time{}, time.Time{}, ExitCrash, "panic"},
		{"crashed after the teardown's SIGTERM", 2, "", term.UnixMilli() + 100, panicked, term, time.Time{}, ExitCrash, "panic"},
		{"SIGKILLed before the teardown's SIGTERM", 137, "SIGKILL", term.UnixMilli() - 100, nil, time.Time{}, time.Time{}, 137, ""},
		{"SIGKILLed before the teardown's SIGKILL", 137, "SIGKILL", term.UnixMilli() + 100, nil, term, time.Time{}, 137, ""},
		{"SIGKILLed by the teardown", 137, "SIGKILL", kill.UnixMilli() + 10, nil, term, kill, ExitHang, ""},
		{"SIGTERMed before the teardown's SIGTERM", 143, "SIGTERM", term.UnixMilli() - 100, nil, time.Time{}, time.Time{}, 143, ""},
		{"SIGTERMed by the teardown", 143, "SIGTERM", term.UnixMilli() + 10, nil, term, time.Time{}, ExitHang, ""},
		{"SIGSEGV", 139, "SIGSEGV", term.UnixMilli() + 10, nil, term, time.Time{}, 139, ""},
		{"exit 1 after the teardown began", 1, "", term.UnixMilli() - 100, nil, time.Time{}, time.Time{}, ExitHang, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rec := func(rank, culprit int, at int64) {
				r := runlog.ErrorRecord{Error: "collective failed", Rank: rank, TimeMS: at, Culprit: &culprit}
				b, _ := json.Marshal(r)
				os.MkdirAll(filepath.Join(dir, RankDir(rank)), 0o755)
				os.WriteFile(filepath.Join(dir, RankDir(rank), runlog.ErrorFile), b, 0o644)
			}
			rec(0, 1, tear.UnixMilli()-20)
			rec(2, 1, tear.UnixMilli()-10)
			rec(1, 0, tear.UnixMilli()+5) // the abort's, blaming the first exit
			j := &job{world: 3, ranks: []rankSpec{{Rank: 0}, {Rank: 1}, {Rank: 2}}}
			a := &attempt{j: j, dir: dir, tearAt: tear, termAt: tc.termAt, killAt: tc.killAt, outcome: OutcomeRankFailed, byRank: map[int]*proc{},
				remoteFails: map[int]RootCause{}, stoppedStates: map[int]string{}, pl: &plane{joining: map[int]time.Time{}, seen: map[int]time.Time{1: tear}}}
			for r := range 3 {
				p := &proc{spec: j.ranks[r], done: true}
				p.out = RankOutcome{Rank: r, ExitCode: 1, EndMS: tear.UnixMilli() + int64(r)}
				if r == 1 {
					p.out.ExitCode, p.out.Signal, p.out.EndMS, p.crashed = tc.code, tc.signal, tc.endMS, tc.crashed
				}
				a.procs = append(a.procs, p)
				a.byRank[r] = p
			}
			a.root = &RootCause{Rank: 0, ExitCode: 1, TimeMS: tear.UnixMilli()}
			a.victims = []int{1, 2}
			a.blameByVotes()
			rc := a.root
			if rc.Rank != 1 || rc.Hung != (tc.want == ExitHang) || rc.ExitCode != tc.want || rc.Crash != tc.crash || slices.Contains(a.victims, 1) {
				t.Fatalf("root %+v, victims %v: want rank 1, exit %d, crash %q", rc, a.victims, tc.want, tc.crash)
			}
			if tc.crashed != nil && (rc.Error != tc.crashed.Line || len(rc.Stack) != 2) {
				t.Errorf("error %q, stack %q: want the crash's", rc.Error, rc.Stack)
			}
			if tc.want != ExitHang && tc.signal != "" && rc.Signal != tc.signal {
				t.Errorf("signal %q, want %q", rc.Signal, tc.signal)
			}
		})
	}
}
