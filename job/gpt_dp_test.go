package job

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// gptReport is the report on the last line of a gpt run's output.
func gptReport(t *testing.T, out string) GPTReport {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r GPTReport
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("last line is not the report: %v\n%s", err, out)
	}
	return r
}

// TestGPTDataParallel: `worker gpt --mesh dp=2,cp=2,tp=2` trains on 8
// ranks (each dp rank 2 of the 4 sequences, each split over cp) with the
// losses tp=2 prints on the same batches, samples tp=2's text, and sums
// the embeddings' and norms' gradients over dp and cp in one all-reduce.
func TestGPTDataParallel(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	const steps = 4
	args := func(mesh string) []string {
		return []string{"gpt", "--mesh", mesh, "--steps", "4", "--dim", "32", "--heads", "2", "--context", "32", "--batch", "4", "--sample", "20"}
	}
	start := time.Now()
	code, ref, errs := run(t, args("tp=2")...)
	if code != 0 {
		t.Fatalf("tp=2: exit %d\n%s%s", code, ref, errs)
	}
	rr := gptReport(t, ref)
	took := map[string]time.Duration{"tp=2": time.Since(start)}
	for _, tc := range []struct {
		mesh, grads string
	}{{"dp=2,cp=2,tp=2", "all_reduce dp_cp_grads"}, {"dp=2,tp=2", "all_reduce dp_grads"}} {
		start := time.Now()
		code, out, errs := run(t, args(tc.mesh)...)
		if code != 0 {
			t.Fatalf("%s: exit %d\n%s%s", tc.mesh, code, out, errs)
		}
		took[tc.mesh] = time.Since(start)
		r := gptReport(t, out)
		if r.Mesh != tc.mesh || !(r.LossLast < r.LossFirst) || r.HeldOutLoss <= 0 {
			t.Errorf("%s: report %+v", tc.mesh, r)
		}
		if r.Collectives[tc.grads] != 1 {
			t.Errorf("%s: collectives per step %v, want one %s", tc.mesh, r.Collectives, tc.grads)
		}
		// The row sampled comes from dp rank 0 (the first sequence) and,
		// under cp, the cp rank holding the position: tp=2's text.
		if r.Sample != rr.Sample {
			t.Errorf("%s sampled %q, tp=2 %q", tc.mesh, r.Sample, rr.Sample)
		}
		got, want := gptStepLosses(out), gptStepLosses(ref)
		if len(got) != steps || len(want) != steps {
			t.Fatalf("%s: steps %v, tp=2 %v", tc.mesh, got, want)
		}
		for s := 1; s <= steps; s++ {
			if got[s] != want[s] {
				t.Errorf("step %d: %s printed loss %.4f, tp=2 %.4f", s, tc.mesh, got[s], want[s])
			}
		}
		t.Logf("%s: losses %v (tp=2 %v); held-out %.4f (tp=2 %.4f); %v", tc.mesh, got, want, r.HeldOutLoss, rr.HeldOutLoss, r.Collectives)
	}
	t.Logf("times %v", took)
}

// TestGPTDataParallelUsage: what data parallelism refuses is a usage error
// before any work, one line naming what is wrong.
func TestGPTDataParallelUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mesh", "dp=2,cp=2,tp=2", "--batch", "3"}, "batch 3 is not a multiple of dp = 2"},
		{[]string{"--mesh", "dp=4", "--batch", "6"}, "batch 6 is not a multiple of dp = 4"},
		{[]string{"--mesh", "cp=2,dp=2,tp=2"}, "dp=D,cp=C"},
		{[]string{"--mesh", "dp=2,tp=2,cp=2"}, "dp=D,cp=C"},
		{[]string{"--mesh", "tp=2,dp=2"}, "dp=D,tp=N"},
		{[]string{"--mesh", "dp=2,tp=2", "--sequence-parallel"}, "data parallelism (dp) does not combine with sequence parallelism"},
		{[]string{"--mesh", "dp=2,tp=2", "--experts", "2"}, "data parallelism (dp) does not combine with experts"},
	} {
		args := append([]string{"gpt", "--heads", "2", "--dim", "32", "--context", "32", "--steps", "1"}, tc.args...)
		code, out, errs := run(t, args...)
		lines := strings.Split(strings.TrimSpace(errs), "\n")
		if code != ExitUsage || len(lines) != 1 || !strings.Contains(lines[0], tc.want) || out != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, one line naming %q", tc.args, code, out, errs, ExitUsage, tc.want)
		}
		t.Logf("%v: %s", tc.args, lines[0])
	}
}
