package launch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/launch/probe"
	"github.com/meshrun/meshrun/logview"
)

// torchOnPath puts a python3 that imports torch first on the PATH, as for a
// torchrun user, and returns it. It skips without one, unless
// MESHRUN_REQUIRE_TORCH is set (.ci/checks.d/gpt-torch.sh, once it has
// installed torch).
func torchOnPath(t *testing.T) string {
	t.Helper()
	py := torchPython()
	if py == "" {
		if os.Getenv("MESHRUN_REQUIRE_TORCH") != "" {
			t.Fatal("no Python with torch here, and MESHRUN_REQUIRE_TORCH is set")
		}
		t.Skip("no Python with torch here (Debian: apt install python3-torch)")
	}
	pythonOnPath(t, py)
	return py
}

// pythonOnPath makes py the python3 on the PATH.
func pythonOnPath(t *testing.T, py string) {
	t.Helper()
	bindir := t.TempDir()
	abs, err := exec.LookPath(py)
	if err == nil {
		err = os.Symlink(abs, filepath.Join(bindir, "python3"))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bindir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// plainPython is /usr/bin/python3 (or python3), put first on the PATH; it
// skips without one.
func plainPython(t *testing.T) {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import faulthandler").Run() == nil {
			pythonOnPath(t, p)
			return
		}
	}
	t.Skip("no python3 here")
}

// script writes a Python script and returns its path.
func script(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// lineOf is the number of the first line of text holding s.
func lineOf(t *testing.T, text, s string) int {
	t.Helper()
	for i, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return i + 1
		}
	}
	t.Fatalf("no %q in the script", s)
	return 0
}

// why is `launcher logs why` of a job's folder.
func why(t *testing.T, dir string) string {
	t.Helper()
	var out, errb bytes.Buffer
	logview.LogsMain(context.Background(), []string{"why", "--log-dir", filepath.Dir(dir), filepath.Base(dir)}, &out, &errb)
	return out.String() + errb.String()
}

// eventTime is the time of the first event of kind in the job's events.
func eventTime(t *testing.T, dir, kind string) time.Time {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, EventsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e struct {
			Event string `json:"event"`
			TS    int64  `json:"ts_ms"`
		}
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Event == kind {
			return time.UnixMilli(e.TS)
		}
	}
	t.Fatalf("no %s event in %s", kind, dir)
	return time.Time{}
}

// stampOf is the time the launcher read the first line of a rank's log file
// holding s.
func stampOf(t *testing.T, path, s string) time.Time {
	t.Helper()
	b, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(b), "\n") {
		if stamp, rest, ok := strings.Cut(l, " "); ok && strings.Contains(rest, s) {
			ts, err := time.Parse(logview.FileStamp, stamp)
			if err != nil {
				t.Fatal(err)
			}
			return ts
		}
	}
	t.Fatalf("no %q in %s", s, path)
	return time.Time{}
}

const hangScript = `import time
import torch
import torch.distributed as dist


def load_batch(step, rank):
    if rank == 1 and step == 3:
        print("stalling", flush=True)
        time.sleep(3600)  # stalls here
    return torch.ones(4) * rank


def main():
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    for step in range(10):
        x = load_batch(step, rank)
        dist.all_reduce(x)  # the others wait here
    dist.destroy_process_group()


main()
`

// TestPythonHang: a gloo job whose rank 1 stalls in a function of the
// script while the others wait in all_reduce, run both ways a torchrun user
// types it with --hang-after 5s: the launcher exits 125 within hang-after +
// 5 s of the stall, its last line and logs why name rank 1, load_batch and
// its line, and every rank's stacks are in the job's folder.
func TestPythonHang(t *testing.T) {
	torchOnPath(t)
	path := script(t, "hang.py", hangScript)
	stallLine := lineOf(t, hangScript, "stalls here")
	for _, args := range [][]string{
		{"--nproc_per_node=4", "--hang-after", "5s", path},
		{"-n", "4", "--hang-after", "5s", "--", "python3", path},
	} {
		code, dir, stdout, stderr := launch(t, args...)
		if code != ExitHang {
			t.Fatalf("%q: exit %d, want %d\n%s\n%s", args, code, ExitHang, stdout, stderr)
		}
		stalled := stampOf(t, filepath.Join(dir, RankDir(1), "stdout.log"), "stalling")
		if took := eventTime(t, dir, "job_end").Sub(stalled); took > 10*time.Second {
			t.Errorf("%q: the launcher ended %v after the stall, want within hang-after + 5 s", args, took)
		}
		last := lastLine(stderr)
		want := regexp.MustCompile(`root cause rank 1 .*load_batch \(hang\.py:` + strconv.Itoa(stallLine) + `\)`)
		if !want.MatchString(last) || !strings.Contains(last, "ranks 0,2-3") || !strings.Contains(last, "all_reduce") {
			t.Errorf("%q: last line %q, want rank 1 in load_batch (hang.py:%d) and ranks 0,2-3 in all_reduce", args, last, stallLine)
		}
		if w := why(t, dir); !strings.Contains(w, "root cause: rank 1 ") || !strings.Contains(w, "load_batch (hang.py:"+strconv.Itoa(stallLine)+")") {
			t.Errorf("%q: logs why does not name rank 1 in load_batch:\n%s", args, w)
		}
		files, _ := filepath.Glob(filepath.Join(dir, "stacks-*.txt"))
		if len(files) != 1 {
			t.Fatalf("%q: stacks files %v", args, files)
		}
		b, _ := os.ReadFile(files[0])
		for r := range 4 {
			if !strings.Contains(string(b), "rank "+strconv.Itoa(r)+": ") {
				t.Errorf("%q: %s lists no dump of rank %d:\n%s", args, files[0], r, b)
			}
		}
	}
}

const raiseScript = `import torch
import torch.distributed as dist


def load_batch(step, rank):
    if rank == 2 and step == 3:
        raise ValueError(f"bad batch {step} on rank {rank}")  # raises here
    return torch.ones(4) * rank


def main():
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    for step in range(10):
        dist.all_reduce(load_batch(step, rank))
    dist.destroy_process_group()


main()
`

// TestPythonException: a rank that raises in a function of the script is
// the root cause, and the failure line and logs why show the exception's
// type, message and function, within 2 s of the raise.
func TestPythonException(t *testing.T) {
	torchOnPath(t)
	path := script(t, "raise.py", raiseScript)
	line := lineOf(t, raiseScript, "raises here")
	code, dir, stdout, stderr := launch(t, "--nproc_per_node=4", path)
	if code != 1 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	want := "root cause rank 2 (node 0, pid "
	head := "raised ValueError: bad batch 3 on rank 2 in load_batch (raise.py:" + strconv.Itoa(line) + ")"
	last := lastLine(stderr)
	if !strings.Contains(last, want) || !strings.Contains(last, head) {
		t.Errorf("last line %q, want %q ... %q", last, want, head)
	}
	if w := why(t, dir); !strings.Contains(w, head) {
		t.Errorf("logs why does not show %q:\n%s", head, w)
	}
	e := logview.ReadPythonException(filepath.Join(dir, RankDir(2), probe.PythonExceptionFile))
	if e == nil {
		t.Fatal("rank 2 wrote no exception record")
	}
	raised := stampOf(t, filepath.Join(dir, RankDir(2), "stderr.log"), "Traceback")
	if took := eventTime(t, dir, "job_end").Sub(raised); took > 2*time.Second {
		t.Errorf("the launcher ended %v after the traceback, want within 2 s", took)
	}
}

func lastLine(s string) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	return ls[len(ls)-1]
}

const runningScript = `import sys
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
total = 0.0
for step in range(60):
    x = torch.ones(4) * (rank + step)
    dist.all_reduce(x)
    total += float(x.sum())
    print(f"step {step}", flush=True)
    time.sleep(0.05)
print(f"total {total:g}", flush=True)
dist.destroy_process_group()
`

// TestStacksRunningJob: launcher stacks on a healthy job prints every
// rank's stack and the job goes on: the same result, exit 0.
func TestStacksRunningJob(t *testing.T) {
	torchOnPath(t)
	path := script(t, "run.py", runningScript)
	logDir := t.TempDir()
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		var out, errb bytes.Buffer
		code := Main(context.Background(), []string{"run", "--worker", worker(), "--log-dir", logDir, "--job-id", "running", "-n", "2", "--", "python3", path}, &out, &errb)
		done <- result{code, out.String(), errb.String()}
	}()
	dir := filepath.Join(logDir, "running")
	deadline := time.Now().Add(60 * time.Second)
	for {
		b0, _ := os.ReadFile(filepath.Join(dir, RankDir(0), "stdout.log"))
		b1, _ := os.ReadFile(filepath.Join(dir, RankDir(1), "stdout.log"))
		if bytes.Contains(b0, []byte("step 5")) && bytes.Contains(b1, []byte("step 5")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the job did not reach step 5 in 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	var out, errb bytes.Buffer
	if code := probe.StacksMain([]string{"--log-dir", logDir, "running"}, &out, &errb); code != 0 {
		t.Fatalf("launcher stacks: exit %d: %s", code, errb.String())
	}
	for r := range 2 {
		if !strings.Contains(out.String(), "rank "+strconv.Itoa(r)+": ") {
			t.Errorf("launcher stacks shows no dump of rank %d:\n%s", r, out.String())
		}
	}
	if !strings.Contains(out.String(), "run.py:") {
		t.Errorf("launcher stacks shows no frame of the script:\n%s", out.String())
	}
	r := <-done
	if r.code != 0 {
		t.Fatalf("the job: exit %d after launcher stacks\n%s", r.code, r.stderr)
	}
	// Σ over steps of 4·Σ_rank (rank + step) = 4·Σ (1 + 2·step) = 4·3600.
	if !strings.Contains(r.stdout, "total 14400") {
		t.Errorf("the job's result changed: %s", r.stdout)
	}
}

// TestHangWithoutDumps: ranks that write no stacks (a program that is not
// Python, a Python rank that ignores SIGUSR1) still get a line from /proc,
// and the launcher ends the hang in time.
func TestHangWithoutDumps(t *testing.T) {
	plainPython(t)
	ignore := script(t, "ignore.py", "import signal, time\nsignal.signal(signal.SIGUSR1, signal.SIG_IGN)\ntime.sleep(600)\n")
	// A shell that starts Python: the Python announces itself and is the
	// one signalled (the shell would die of SIGUSR1).
	sleeper := script(t, "sleeper.py", "import time\n\ndef block_here():\n    time.sleep(600)\n\nblock_here()\n")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-n", "2", "--hang-after", "2s", "--", "sleep", "600"}, "ranks 0-1: S (sleeping)"},
		{[]string{"-n", "2", "--hang-after", "2s", "--", "python3", ignore}, "wrote no stacks within"},
		{[]string{"-n", "2", "--hang-after", "2s", "--", "sh", "-c", "python3 " + sleeper}, "ranks 0-1 in block_here (sleeper.py:4)"},
	} {
		start := time.Now()
		code, dir, stdout, stderr := launch(t, tc.args...)
		if code != ExitHang {
			t.Fatalf("%q: exit %d\n%s\n%s", tc.args, code, stdout, stderr)
		}
		if took := time.Since(start); took > 2*time.Second+8*time.Second {
			t.Errorf("%q: took %v", tc.args, took)
		}
		if last := lastLine(stderr); !strings.Contains(last, tc.want) {
			t.Errorf("%q: last line %q, want %q", tc.args, last, tc.want)
		}
		if w := why(t, dir); !strings.Contains(w, "hung") {
			t.Errorf("%q: logs why:\n%s", tc.args, w)
		}
	}
}

// TestWorkerStall: meshrun's own workers, rank 1 stalling in a function
// of its own while the others wait in a barrier: the hang found in the
// heartbeats names the function and its line from rank 1's goroutine dump.
func TestWorkerStall(t *testing.T) {
	code, dir, stdout, stderr := launch(t, "-n", "3", "--hang-after", "2s", "barrier", "--stall-rank", "1")
	if code != ExitHang {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	want := regexp.MustCompile(`root cause rank 1 .*never entered barrier.*it was in job\.stall \(smoke\.go:\d+\)`)
	if last := lastLine(stderr); !want.MatchString(last) {
		t.Errorf("last line %q, want %s", last, want)
	}
	if w := why(t, dir); !strings.Contains(w, "job.stall (smoke.go:") {
		t.Errorf("logs why:\n%s", w)
	}
}

// TestFlightRecorder: a program's ranks get PyTorch's flight recorder for
// NCCL (unless set), dumping into their folders, and logs why lists the
// dumps a failed job left there.
func TestFlightRecorder(t *testing.T) {
	prog := `echo "$TORCH_NCCL_TRACE_BUFFER_SIZE $TORCH_NCCL_DUMP_ON_TIMEOUT $TORCH_NCCL_DEBUG_INFO_TEMP_FILE"; ` +
		`echo trace > "${TORCH_NCCL_DEBUG_INFO_TEMP_FILE}${RANK}"; exit 3`
	code, dir, stdout, stderr := launch(t, "-n", "2", "--", "sh", "-c", prog)
	if code != 3 {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	b, _ := os.ReadFile(filepath.Join(dir, RankDir(1), "stdout.log"))
	if want := "2000 1 " + filepath.Join(dir, RankDir(1), FlightRecorderPrefix); !strings.Contains(string(b), want) {
		t.Errorf("rank 1's environment: %q, want %q", b, want)
	}
	w := why(t, dir)
	for r := range 2 {
		if f := filepath.Join(RankDir(r), FlightRecorderPrefix+strconv.Itoa(r)); !strings.Contains(w, f) {
			t.Errorf("logs why does not list %s:\n%s", f, w)
		}
	}
}
