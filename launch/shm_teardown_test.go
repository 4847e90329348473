package launch

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/meshrun/meshrun/internal/testtime"
)

// TestShmTeardown: one rank of four of a job on shared memory is SIGTERMed
// while the job trains; the launcher tears the job down and exits within
// 0.2 s of the SIGTERM (scaled: testtime), ten times in a row. A
// survivor's World used to wait in Close for a state request its control
// plane had sent to a rank on its way out (taking over the ranks the
// SIGTERMed one watched), which timed out after 1.0 s: 15 runs of 80 took
// 1.02-1.06 s where the others took 0.02-0.08 s (collective
// TestCloseWhileTakingOver has the cause alone).
func TestShmTeardown(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 10 jobs")
	}
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	t.Setenv("MESHRUN_TRANSPORT", "shm") // the ranks inherit it
	limit := testtime.Scale(200 * time.Millisecond)
	var took []time.Duration
	for i := range 10 {
		job := fmt.Sprintf("shm-teardown-%d", i)
		l := startLauncher(t, "--job-id", job, "-n", "4", "mlp", "--tokens", "64", "--hidden", "64", "--steps", "1000000")
		dir := filepath.Join(l.dir, job)
		rec := waitJobRecord(t, dir)
		waitFor(t, 30*time.Second, "training", func() bool {
			b, _ := os.ReadFile(filepath.Join(dir, RankDir(0), "stdout.log"))
			return bytes.Contains(b, []byte("step 20/"))
		})
		sent := time.Now()
		if err := syscall.Kill(rec.Ranks[1].PID, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		l.wait(t, 10*time.Second)
		d := l.end.Sub(sent)
		took = append(took, d.Round(time.Millisecond))
		// The exit code is the root cause's: rank 1's SIGTERM (143), also
		// when its peers' exits are seen first (a signal the teardown had
		// not sent is the rank's own end, not a hang).
		if l.code != 143 {
			t.Errorf("run %d: exit %d after rank 1's SIGTERM, want 143: %s", i, l.code, finalLine(l.err.String()))
		}
		for r := range 4 {
			b, _ := os.ReadFile(filepath.Join(dir, RankDir(r), "log.jsonl"))
			if !bytes.Contains(b, []byte(`"transport":"shm"`)) {
				t.Errorf("run %d: rank %d did not join over shm", i, r)
			}
		}
		if d > limit {
			t.Errorf("run %d: the launcher exited %v after rank 1's SIGTERM, want < %v", i, d.Round(time.Millisecond), limit)
		}
	}
	t.Logf("the launcher exited %v after the SIGTERM", took)
}
