package launch

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPipelineStageFaults: a GPT pipeline stage (pp=3; 1F1B, and the
// interleaved schedule round its ring) that dies, or hangs,
// is the job's root cause, named as for collectives; its neighbours, which
// wait on it, are torn down as victims, and the launcher ends in time. A
// stopped stage is named by its silence, or, when the last stage reached
// the step's all-reduce first, as the stopped one of the ranks missing
// from it (its neighbour, asleep waiting on it, is missing too).
func TestPipelineStageFaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		want *regexp.Regexp
		args []string
	}{
		{"dies", syscall.SIGKILL, regexp.MustCompile(`root cause rank 1 \(node 0, pid \d+\) was killed by SIGKILL .*; 2 other ranks torn down`), nil},
		{"hangs", syscall.SIGSTOP, regexp.MustCompile(`hang: root cause rank 1 \(node 0, pid \d+\) (stopped answering its peers|\(with ranks 0-1\) never entered) .*its process was T \(stopped\);.* 2 other ranks torn down`), nil},
		// Round the ring of the interleaved schedule: stage 0 talks to
		// the last stage too.
		{"dies-interleaved", syscall.SIGKILL, regexp.MustCompile(`root cause rank 1 \(node 0, pid \d+\) was killed by SIGKILL .*; 2 other ranks torn down`),
			[]string{"--schedule", "interleaved", "--layers", "6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logDir := t.TempDir()
			var out, errb syncBuffer
			res := make(chan int, 1)
			id := "pp-" + tc.name
			go func() {
				res <- Main(context.Background(), append([]string{"run", "--worker", worker(), "--log-dir", logDir, "--job-id", id, "--grace", "1s",
					"--hang-after", "2s", "-n", "3", "gpt", "--mesh", "pp=3", "--layers", "3", "--dim", "32", "--heads", "2", "--context", "16",
					"--batch", "6", "--steps", "100000", "--sample", "0"}, tc.args...), &out, &errb)
			}()
			rec := waitJobRecord(t, filepath.Join(logDir, id))
			waitFor(t, 60*time.Second, "the pipeline's third step", func() bool { return strings.Contains(out.String(), "step 3/") })
			if err := syscall.Kill(rec.Ranks[1].PID, tc.sig); err != nil {
				t.Fatal(err)
			}
			defer syscall.Kill(rec.Ranks[1].PID, syscall.SIGKILL)
			select {
			case code := <-res:
				if code == 0 {
					t.Fatalf("the job survived stage 1's fault:\n%s", errb.String())
				}
			case <-time.After(60 * time.Second):
				t.Fatal("the launcher did not end")
			}
			if last := lastLine(errb.String()); !tc.want.MatchString(last) {
				t.Errorf("last line %q, want %s", last, tc.want)
			}
		})
	}
}

// TestHangCulprit: of the ranks missing from a collective, a stopped one is
// the root cause, not the first, which may be asleep waiting on it.
func TestHangCulprit(t *testing.T) {
	for _, tc := range []struct {
		missing []int
		states  map[string]string
		want    int
	}{
		{[]int{0, 1}, map[string]string{"0": "S (sleeping)", "1": "T (stopped)"}, 1},
		{[]int{0, 1, 3}, map[string]string{"0": "S (sleeping)", "3": "t (tracing stop)"}, 3},
		{[]int{2, 5}, map[string]string{"2": "S (sleeping)", "5": "R (running)"}, 2},
		{[]int{4}, nil, 4},
	} {
		if got := hangCulprit(tc.missing, tc.states); got != tc.want {
			t.Errorf("missing %v, states %v: rank %d, want %d", tc.missing, tc.states, got, tc.want)
		}
	}
}
