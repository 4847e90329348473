package launch

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
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
