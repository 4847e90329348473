package launch

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/internal/testtime"
	"github.com/meshrun/meshrun/logview"
)

// TestTorchrunFlags: torchrun's flags, in its spellings, mean what they mean
// to torchrun; what meshrun cannot do is refused naming the flag.
func TestTorchrunFlags(t *testing.T) {
	o, err := ParseRunFlags([]string{"--nproc_per_node=2", "--nnodes=2:2", "--node_rank=1", "--max_restarts=3",
		"--master_addr=10.0.0.1", "--master_port=29500", "--rdzv_endpoint=10.0.0.1:4222", "--rdzv_id=run7",
		"--rdzv_backend=c10d", "--rdzv_conf=join_timeout=90,read_timeout=60", "--role=trainer", "-r", "0:1,1:3", "--tee=2",
		"--local_addr=10.0.0.2", "--monitor_interval=5", "--start_method=spawn", "train.py", "--lr", "0.1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.NprocPerNode != "2" || o.NNodes != 2 || o.NodeRank != 1 || o.MaxRestarts != 3 || o.MasterAddr != "10.0.0.1" ||
		o.MasterPort != 29500 || o.NATS != "nats://10.0.0.1:4222" || o.JobID != "run7" || o.Role != "trainer" ||
		o.Redirects != "0:1,1:3" || o.Tee != "2" || o.LocalAddr != "10.0.0.2" {
		t.Errorf("parsed %+v", o)
	}
	if d, err := o.rendezvousTimeout(); err != nil || d != 90*time.Second {
		t.Errorf("join_timeout: %v %v", d, err)
	}
	if path, args, workload := o.command(); workload || path != "python3" || strings.Join(args, " ") != "-u train.py --lr 0.1" {
		t.Errorf("command %s %q (workload %v)", path, args, workload)
	}
	o, _ = ParseRunFlags([]string{"--nproc-per-node", "2", "-m", "pkg.train", "--x"}, nil)
	if path, args, _ := o.command(); path != "python3" || strings.Join(args, " ") != "-u -m pkg.train --x" {
		t.Errorf("module: %s %q", path, args)
	}
	o, _ = ParseRunFlags([]string{"--no_python", "./train.py", "--x"}, nil)
	if path, args, _ := o.command(); path != "./train.py" || strings.Join(args, " ") != "--x" {
		t.Errorf("--no-python: %s %q", path, args)
	}
	o, _ = ParseRunFlags([]string{"-n", "2", "mlp", "--steps", "3"}, nil)
	if _, args, workload := o.command(); !workload || strings.Join(args, " ") != "mlp --steps 3" {
		t.Errorf("workload: %q %v", args, workload)
	}

	if _, err := ParseRunFlags([]string{"--nnodes=1:2", "x.py"}, nil); err == nil || !strings.Contains(err.Error(), "elastic range") {
		t.Errorf("--nnodes 1:2: %v", err)
	}
	if _, err := ParseRunFlags([]string{"--rdzv_id=a", "--job-id=b", "x.py"}, nil); err == nil || !strings.Contains(err.Error(), "--rdzv-id") {
		t.Errorf("--rdzv-id and --job-id: %v", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--rdzv_backend=etcd", "x.py"}, "--rdzv-backend etcd"},
		{[]string{"--standalone", "--nnodes=2", "x.py"}, "--standalone"},
		{[]string{"--redirects=4", "x.py"}, "--redirects"},
		{[]string{"--tee=0:5", "x.py"}, "--tee"},
		{[]string{"--max_restarts=-1", "x.py"}, "--max-restarts"},
		{[]string{"--master_port=70000", "x.py"}, "--master-port"},
		{[]string{"--rdzv_conf=joins=3", "x.py"}, "unknown key"},
		{[]string{"--logs_specs=x", "x.py"}, "--logs-specs"},
		{[]string{"--local_ranks_filter=0", "--console=1", "x.py"}, "--local-ranks-filter"},
		{[]string{"--python=/nonexistent/python", "x.py"}, "not found"},
		{[]string{"-m", "--no_python", "x"}, "exclude one another"},
	} {
		o, err := ParseRunFlags(tc.args, nil)
		if err == nil {
			err = o.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}

// TestStdSpec: --redirects keeps streams off the console, --tee puts them
// back, per local rank.
func TestStdSpec(t *testing.T) {
	j := &job{RunOptions: RunOptions{Redirects: "0:3,1:1", Tee: "0:2", NodeRank: 1}, ranks: make([]rankSpec, 2)}
	for _, tc := range []struct {
		rank, stream int
		want         bool
	}{{2, 1, false}, {2, 2, true}, {3, 1, false}, {3, 2, true}} {
		if got := j.shown(tc.rank, tc.stream); got != tc.want {
			t.Errorf("rank %d stream %d shown %v, want %v", tc.rank, tc.stream, got, tc.want)
		}
	}
}

// TestMaxRestarts: a rank that fails once is restarted with every rank, the
// job succeeds on its second attempt, and summary.json and logs why show both
// attempts; a rank that always fails ends the job with its exit code after 1
// + --max-restarts attempts.
func TestMaxRestarts(t *testing.T) {
	once := `if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then echo failing >&2; exit 3; fi; echo "rank $RANK attempt $TORCHELASTIC_RESTART_COUNT of max $TORCHELASTIC_MAX_RESTARTS"`
	code, dir, _, stderr := launch(t, "--max-restarts", "2", "-n", "2", "--", "sh", "-c", once)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	if len(sum.Attempts) != 2 || sum.Attempts[0].Reason != OutcomeRankFailed || sum.Attempts[0].ExitCode != 3 ||
		sum.Attempts[0].RootCauseRank == nil || *sum.Attempts[0].RootCauseRank != 1 ||
		sum.Attempts[1].Reason != OutcomeOK || sum.Attempt != 1 || sum.Reason != OutcomeOK || sum.Attempts[1].Dir != "attempt-1" {
		t.Fatalf("summary: %+v", sum)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "attempt-1", RankDir(1), "stdout.log"))
	if !bytes.Contains(b, []byte("rank 1 attempt 1 of max 2")) {
		t.Errorf("attempt 1's rank 1 printed %q", b)
	}
	if !strings.Contains(stderr, "attempt 0 ended (rank_failed, exit 3): restarting every rank (restart 1 of 2)") {
		t.Errorf("console:\n%s", stderr)
	}
	var why bytes.Buffer
	if err := logview.Why(dir, &why); err != nil || !strings.Contains(why.String(), "attempt 0: rank_failed, root cause rank 1, exit 3") ||
		!strings.Contains(why.String(), "attempt 1: ok, exit 0") {
		t.Errorf("logs why: %v\n%s", err, why.String())
	}
	why.Reset()
	if err := logview.WhyAttempt(dir, 0, &why); err != nil || !strings.Contains(why.String(), "root cause: rank 1 on node 0 exited with code 3") ||
		!strings.Contains(why.String(), "failing") {
		t.Errorf("logs why --attempt 0: %v\n%s", err, why.String())
	}
	// The subcommands: logs and trace show the last attempt's ranks unless
	// --attempt says which; logs says so.
	logDir, job := filepath.Dir(dir), filepath.Base(dir)
	cli := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := launcherMain(context.Background(), append(args, "--log-dir", logDir, job), &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, out, errs := cli("logs", "--rank", "1"); code != 0 || strings.Contains(out, "failing") || !strings.Contains(out, "rank 1 attempt 1") ||
		!strings.Contains(errs, "ran attempts 0 to 1; showing attempt 1 (--attempt K for another)") {
		t.Errorf("logs: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := cli("logs", "--rank", "1", "--attempt", "0"); code != 0 || !strings.Contains(out, "failing") || strings.Contains(out, "attempt 1") {
		t.Errorf("logs --attempt 0: exit %d\n%s%s", code, out, errs)
	}
	if code, out, errs := cli("logs", "why", "--attempt", "0"); code != 0 || !strings.Contains(out, "root cause: rank 1 on node 0 exited with code 3") {
		t.Errorf("logs why --attempt 0: exit %d\n%s%s", code, out, errs)
	}
	for _, args := range [][]string{{"logs", "--attempt", "2"}, {"logs", "why", "--attempt", "2"}, {"trace", "--attempt", "2", "-o", "-"}} {
		if code, _, errs := cli(args...); code != 1 || !strings.Contains(errs, "no attempt 2") {
			t.Errorf("%v: exit %d, %q", args, code, errs)
		}
	}

	code, dir, _, stderr = launch(t, "--max-restarts", "2", "-n", "2", "--", "sh", "-c", `[ "$RANK" = 1 ] && exit 4; sleep 10`)
	if code != 4 {
		t.Fatalf("always failing: exit %d:\n%s", code, stderr)
	}
	sum = readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	if len(sum.Attempts) != 3 || sum.Attempt != 2 {
		t.Fatalf("summary: %+v", sum)
	}
	for _, a := range sum.Attempts {
		if a.Reason != OutcomeRankFailed || a.ExitCode != 4 || a.RootCauseRank == nil || *a.RootCauseRank != 1 {
			t.Errorf("attempt %+v", a)
		}
	}
	if !strings.Contains(stderr, "(attempt 2, after 2 restarts)") {
		t.Errorf("last line does not count the attempts:\n%s", stderr)
	}
}

// TestHangRootCause: rank 1 stops before a barrier its peers wait in; within
// --hang-after + 2 s the console, summary.json and logs why all name rank 1
// as the root cause, the waiting ranks as victims.
func TestHangRootCause(t *testing.T) {
	hangAfter := 2 * time.Second
	code, dir, _, stderr := launch(t, "--hang-after", hangAfter.String(), "-n", "3", "--", ranktest(), "-steps", "0", "-block-rank", "1", "-at", "3")
	ended := time.Now()
	checkStuck(t, code, dir, stderr, ended, hangAfter)
}

// TestTimeoutBlamesStuckRank: with hang diagnosis off, the peers' collective
// deadline finds rank 1 stuck: the rank that timed out waiting is a victim,
// rank 1 the root cause.
func TestTimeoutBlamesStuckRank(t *testing.T) {
	deadline := 2 * time.Second
	t.Setenv("MESHRUN_COLLECTIVE_TIMEOUT", deadline.String())
	code, dir, _, stderr := launch(t, "--hang-after", "0", "-n", "3", "--", ranktest(), "-steps", "0", "-block-rank", "1", "-at", "3")
	ended := time.Now()
	rc := checkStuck(t, code, dir, stderr, ended, deadline)
	if rc != nil && rc.ReportedBy == nil {
		t.Errorf("root cause does not say who found it: %+v", rc)
	}
}

// checkStuck checks a job ended naming rank 1, stuck, within after + 2 s of
// rank 1 stopping.
func checkStuck(t *testing.T, code int, dir, stderr string, ended time.Time, after time.Duration) *RootCause {
	t.Helper()
	if code != ExitHang {
		t.Errorf("exit %d, want %d:\n%s", code, ExitHang, stderr)
	}
	es, err := logview.ReadLogs(dir, map[int]bool{1: true})
	var blocked time.Time
	for _, e := range es {
		if strings.Contains(e.Text(), "blocking before the barrier") {
			blocked = time.UnixMilli(e.TimeMS)
		}
	}
	if err != nil || blocked.IsZero() {
		t.Fatalf("rank 1 never blocked (%v):\n%s", err, stderr)
	}
	if d, bound := ended.Sub(blocked), after+testtime.Scale(2*time.Second); d > bound {
		t.Errorf("the job ended %v after rank 1 blocked, want within %v", d, bound)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "hang: root cause rank 1 (node 0, pid ") || !strings.Contains(last, "never entered barrier seq ") {
		t.Errorf("console's last line: %s", last)
	}
	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	rc := sum.RootCause
	if sum.Reason != OutcomeHang || rc == nil || rc.Rank != 1 || !rc.Hung || sum.RootCauseRank == nil || *sum.RootCauseRank != 1 ||
		fmt.Sprint(sum.Victims) != "[0 2]" {
		t.Errorf("summary: reason %s, root cause %+v, victims %v", sum.Reason, rc, sum.Victims)
	}
	var why bytes.Buffer
	if err := logview.Why(dir, &why); err != nil || !strings.Contains(why.String(), "root cause: rank 1 on node 0 hung") ||
		!strings.Contains(why.String(), "victims (torn down, not the cause): ranks 0,2") {
		t.Errorf("logs why: %v\n%s", err, why.String())
	}
	return rc
}

// torchPython is a Python with torch, or "" (Debian's python3-torch is in
// /usr/bin): $MESHRUN_PYTHON first, when set.
func torchPython() string {
	for _, p := range []string{os.Getenv("MESHRUN_PYTHON"), "python3", "/usr/bin/python3"} {
		if p == "" {
			continue
		}
		if exec.Command(p, "-c", "import torch.distributed").Run() == nil {
			return p
		}
	}
	return ""
}

const torchScript = `import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
dist.barrier()
env = " ".join(k + "=" + os.environ.get(k, "-") for k in ("LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "LOCAL_WORLD_SIZE",
    "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "OMP_NUM_THREADS"))
print(f"rank {rank} of {world}: all_reduce {t.item():g}; {env}", flush=True)
assert t.item() == world * (world + 1) / 2
dist.destroy_process_group()
`

// TestTorchScript: an ordinary torch.distributed gloo program using env://
// runs under the launcher as a program after --, and as a torchrun user types
// it (--nproc_per_node=2 --standalone script.py). It skips without a Python
// with torch, unless MESHRUN_REQUIRE_TORCH is set (.ci/checks.d/gpt-torch.sh,
// once it has installed torch).
func TestTorchScript(t *testing.T) {
	torchOnPath(t)
	script := filepath.Join(t.TempDir(), "script.py")
	if err := os.WriteFile(script, []byte(torchScript), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-n", "2", "--", "python3", script},
		{"--nproc_per_node=2", "--standalone", script},
	} {
		code, dir, stdout, stderr := launch(t, args...)
		if code != 0 {
			t.Fatalf("%q: exit %d\n%s\n%s", args, code, stdout, stderr)
		}
		for r, want := range []string{
			"rank 0 of 2: all_reduce 3; LOCAL_RANK=0 GROUP_RANK=0 ROLE_RANK=0 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RESTART_COUNT=0 MASTER_ADDR=127.0.0.1 OMP_NUM_THREADS=",
			"rank 1 of 2: all_reduce 3; LOCAL_RANK=1 GROUP_RANK=0 ROLE_RANK=1 LOCAL_WORLD_SIZE=2",
		} {
			b, _ := os.ReadFile(filepath.Join(dir, RankDir(r), "stdout.log"))
			if !bytes.Contains(b, []byte(want)) {
				t.Errorf("%q: rank %d printed %q, want %q", args, r, b, want)
			}
		}
	}
}

// TestTorchErrorFile: the root cause's error comes from the file torch's
// @record writes when the rank wrote no error.json.
func TestTorchErrorFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, TorchErrorFile)
	os.WriteFile(path, []byte(`{"message": {"message": "RuntimeError: boom\nmore", "extraInfo": {"py_callstack": "..."}}}`), 0o644)
	if got := torchError(path); got != "RuntimeError: boom" {
		t.Errorf("got %q", got)
	}
	if got := torchError(filepath.Join(dir, "none")); got != "" {
		t.Errorf("missing file: %q", got)
	}
}

// TestRunUsageListsEveryFlag: `launcher run -h` names every flag run takes
// (the underscore spellings apart, which it states once).
func TestRunUsageListsEveryFlag(t *testing.T) {
	var o RunOptions
	o.flagSet().VisitAll(func(f *flag.Flag) {
		if strings.Contains(f.Name, "_") {
			return
		}
		dash := "--" + f.Name
		if len(f.Name) == 1 {
			dash = "-" + f.Name + ","
		}
		if !strings.Contains(runUsage, dash) {
			t.Errorf("launcher run -h does not mention %s", dash)
		}
	})
}

// TestLogsFollowRestart: `logs -f` started during attempt 0 prints the rest
// of it, then follows the job into attempt 1, and stops when the job ends.
func TestLogsFollowRestart(t *testing.T) {
	script := `echo "attempt $TORCHELASTIC_RESTART_COUNT started"; sleep 0.5; ` +
		`if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exit 3; fi; echo "attempt $TORCHELASTIC_RESTART_COUNT done"`
	l := startLauncher(t, "--job-id", "follow", "--max-restarts", "1", "-n", "2", "--", "sh", "-c", script)
	l.waitEvent(t, "follow", "rank_start")
	var out, errb bytes.Buffer
	code := launcherMain(context.Background(), []string{"logs", "-f", "--rank", "0", "--log-dir", l.dir, "follow"}, &out, &errb)
	l.wait(t, 10*time.Second)
	if code != 0 || l.code != 0 {
		t.Fatalf("logs -f: exit %d, job exit %d: %s", code, l.code, errb.String())
	}
	o := out.String()
	a0, sep, a1 := strings.Index(o, "attempt 0 started"), strings.Index(o, "--- attempt 1 ("), strings.Index(o, "attempt 1 done")
	if a0 < 0 || sep < a0 || a1 < sep {
		t.Errorf("logs -f across the restart:\n%s", o)
	}
}
