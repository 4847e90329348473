package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshrun/meshrun/ckpt"
)

// TestCheckpointSurvivesSIGKILL: a rank SIGKILLed in the middle of a save
// leaves the previous checkpoint whole: it opens, verifies and resumes, and the
// unfinished save is not taken for a checkpoint.
func TestCheckpointSurvivesSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 128 MiB checkpoints")
	}
	root := filepath.Join(t.TempDir(), "ckpt")
	logDir := t.TempDir()
	var out, errb bytes.Buffer
	res := make(chan int, 1)
	// 2 x 1024 x 16384 float32 parameters: 64 MiB a rank a save.
	args := []string{"mlp", "--tokens", "8", "--hidden", "1024", "--ffn", "16384", "--steps", "200", "--save", root, "--save-every", "1", "--keep", "2"}
	go func() {
		res <- Main(context.Background(), append([]string{"run", "--worker", worker(), "--log-dir", logDir, "--job-id", "ckpt-kill", "--grace", "1s", "-n", "2"}, args...), &out, &errb)
	}()
	rec := waitJobRecord(t, filepath.Join(logDir, "ckpt-kill"))
	// Once a checkpoint is complete, kill rank 1 as soon as the next save's
	// temporary folder appears.
	var killedStep string
	waitFor(t, 60*time.Second, "a save in progress after a complete one", func() bool {
		steps, _ := ckpt.Steps(ckpt.OS, root)
		if len(steps) == 0 {
			return false
		}
		ents, _ := os.ReadDir(root)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".tmp-step-") {
				if err := syscall.Kill(rec.Ranks[1].PID, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				killedStep = strings.TrimPrefix(e.Name(), ".tmp-")
				return true
			}
		}
		return false
	})
	select {
	case code := <-res:
		if code == 0 {
			t.Fatalf("the job survived a SIGKILLed rank: %s", errb.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the launcher did not end")
	}
	// Every checkpoint there is whole (the killed save either never became one
	// or, if rank 1 died after the commit, is complete), and the newest opens.
	steps, err := ckpt.Steps(ckpt.OS, root)
	if err != nil || len(steps) == 0 {
		t.Fatalf("checkpoints %v: %v", steps, err)
	}
	for _, s := range steps {
		c, err := ckpt.Open(ckpt.OS, ckpt.StepDir(root, s))
		if err == nil {
			err = c.Verify()
		}
		if err != nil {
			t.Fatalf("checkpoint of step %d: %v", s, err)
		}
	}
	c, err := ckpt.Open(ckpt.OS, root)
	if err != nil {
		t.Fatal(err)
	}
	_, statErr := os.Stat(filepath.Join(root, killedStep))
	t.Logf("killed during %s (committed before the kill: %v); newest checkpoint %s verifies", killedStep, statErr == nil, filepath.Base(c.Dir))
	// It resumes: one more step from it, on one rank.
	cmd := exec.Command(worker(), append(args[:7:7], "--steps", itoa(c.Index.Step+1), "--resume", root)...)
	if b, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(b), "\"first_step\":"+itoa(c.Index.Step+1)) {
		t.Fatalf("resume: %v\n%s", err, b)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestRestartResumes: with --max-restarts and mlp --save, a rank SIGKILLed
// mid-run restarts the job, and attempt 1 resumes from the newest checkpoint
// attempt 0 saved (its rank 0 says so), trains the remaining steps only, and
// ends at the loss of an uninterrupted run.
func TestRestartResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("trains twice")
	}
	work := []string{"mlp", "--tokens", "128", "--hidden", "256", "--steps", "300"}
	run := func(job string, ctx context.Context, extra ...string) (int, string, string) {
		logDir := t.TempDir()
		var out, errb bytes.Buffer
		code := Main(ctx, append(append([]string{"run", "--worker", worker(), "--log-dir", logDir, "--job-id", job, "--grace", "1s", "-n", "2",
			"--max-restarts", "1"}, work...), extra...), &out, &errb)
		return code, filepath.Join(logDir, job), errb.String()
	}
	code, full, stderr := run("uninterrupted", context.Background())
	if code != 0 {
		t.Fatalf("uninterrupted: exit %d\n%s", code, stderr)
	}
	want := rankReport(t, full, 0)

	dir, root, killed := restartedJob(t, "resumed", work)
	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	if len(sum.Attempts) != 2 || sum.Attempts[0].Reason != OutcomeRankFailed || sum.Reason != OutcomeOK {
		t.Fatalf("summary: %+v", sum)
	}
	if sum.Attempts[0].RootCause == nil || sum.Attempts[0].RootCause.Signal != "SIGKILL" {
		t.Errorf("attempt 0's root cause: %+v", sum.Attempts[0].RootCause)
	}
	got := rankReport(t, filepath.Join(dir, AttemptDir(1)), 0)
	b, _ := os.ReadFile(filepath.Join(dir, AttemptDir(1), RankDir(0), "stderr.log"))
	m := regexp.MustCompile(`mlp: restart 1: resuming from (\S+) at step (\d+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("attempt 1's rank 0 does not say it resumed:\n%s", b)
	}
	step, _ := strconv.Atoi(string(m[2]))
	if string(m[1]) != ckpt.StepDir(root, step) {
		t.Errorf("resumed from %s at step %d", m[1], step)
	}
	t.Logf("killed rank 1 (pid %d); attempt 1 resumed at step %d: first_step %v, loss_last %v (uninterrupted %v)",
		killed, step, got["first_step"], got["loss_last"], want["loss_last"])
	if step < 20 || step%20 != 0 || got["first_step"] != float64(step+1) {
		t.Errorf("resumed at step %d, first_step %v", step, got["first_step"])
	}
	if got["loss_last"] != want["loss_last"] {
		t.Errorf("loss after the restart %v, uninterrupted %v", got["loss_last"], want["loss_last"])
	}
}

// rankReport is the JSON report a workload's rank printed last on stdout.
func rankReport(t *testing.T, dir string, rank int) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, RankDir(rank), "stdout.log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	last := lines[len(lines)-1] // "TIME {...}"
	var m map[string]any
	if err := json.Unmarshal([]byte(last[strings.IndexByte(last, ' ')+1:]), &m); err != nil {
		t.Fatalf("%s: last line %q: %v", dir, lines[len(lines)-1], err)
	}
	return m
}

// restartedJob runs work on 2 ranks with --max-restarts 1, saving every 20
// steps into root, SIGKILLs rank 1 once a checkpoint is saved, and returns
// the job's folder, root and the pid killed once the restarted job has
// ended (exit 0).
func restartedJob(t *testing.T, id string, work []string) (dir, root string, killed int) {
	t.Helper()
	root = filepath.Join(t.TempDir(), "ckpt")
	logDir := t.TempDir()
	var errb syncBuffer
	res := make(chan int, 1)
	go func() {
		res <- Main(context.Background(), append(append([]string{"run", "--worker", worker(), "--log-dir", logDir, "--job-id", id, "--grace", "1s", "-n", "2",
			"--max-restarts", "1"}, work...), "--save", root, "--save-every", "20"), io.Discard, &errb)
	}()
	dir = filepath.Join(logDir, id)
	rec := waitJobRecord(t, dir)
	waitFor(t, 60*time.Second, "a checkpoint", func() bool {
		steps, _ := ckpt.Steps(ckpt.OS, root)
		return len(steps) > 0
	})
	if err := syscall.Kill(rec.Ranks[1].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-res:
		if code != 0 {
			t.Fatalf("exit %d after a restart:\n%s", code, errb.String())
		}
	case <-time.After(120 * time.Second):
		t.Fatal("the launcher did not end")
	}
	return dir, root, rec.Ranks[1].PID
}
