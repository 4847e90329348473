package job

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// TestGPTExperts: `worker gpt --experts 4 --top-k 2 --mesh ep=2,tp=2` trains
// on 4 ranks (the batch and the experts split over ep, attention and the
// experts' inner dim over tp) and its held-out loss falls below the unigram
// entropy of the text; each step's line and the report carry the aux loss.
func TestGPTExperts(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	start := time.Now()
	code, out, errs := run(t, "gpt", "--experts", "4", "--top-k", "2", "--mesh", "ep=2,tp=2", "--steps", gptExpertSteps,
		"--dim", "32", "--heads", "2", "--context", "32", "--batch", "8", "--lr", "1e-2", "--sample", "20")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r GPTReport
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("last line is not the report: %v\n%s", err, out)
	}
	t.Logf("%s: held-out loss %.4f, unigram entropy %.4f, first loss %.4f, last %.4f, aux %.5f, balance %.4f, %v",
		time.Since(start).Round(time.Millisecond), r.HeldOutLoss, r.UnigramEntropy, r.LossFirst, r.LossLast, r.AuxLossLast, r.BalanceLast, r.Collectives)
	if !strings.Contains(out, "step 1/"+gptExpertSteps+" loss ") || !strings.Contains(lines[0], " aux ") {
		t.Errorf("no step lines with the aux loss in\n%s", out)
	}
	if r.Experts != 4 || r.TopK != 2 || r.AuxCoef != 0.01 || r.Mesh != "ep=2,tp=2" || !(r.AuxLossLast > 0) || !(r.BalanceLast >= 1) {
		t.Errorf("report %+v", r)
	}
	if !(r.HeldOutLoss < r.UnigramEntropy) {
		t.Errorf("held-out loss %.4f not below the unigram entropy %.4f", r.HeldOutLoss, r.UnigramEntropy)
	}
}

const gptExpertSteps = "300"

// TestGPTExpertsUsage: the settings --experts refuses are usage errors
// before any work, each one line naming what is wrong.
func TestGPTExpertsUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--experts", "2", "--top-k", "3"}, "top-k 3 with 2 experts"},
		{[]string{"--experts", "2", "--top-k", "0"}, "top-k 0 with 2 experts"},
		{[]string{"--experts", "2", "--dtype", "bfloat16"}, "float32 only"},
		{[]string{"--experts", "2", "--sequence-parallel"}, "sequence parallelism does not combine with experts"},
		{[]string{"--experts", "2", "--batch", "3", "--mesh", "ep=2,tp=2"}, "batch 3 is not a multiple of ep = 2"},
		{[]string{"--experts", "2", "--mesh", "tp=2,ep=2"}, "ep=E,tp=N"},
		{[]string{"--mesh", "ep=2,tp=2"}, "needs --experts"},
		{[]string{"--experts", "2", "--capacity-factor", "-1"}, "capacity factor"},
	} {
		args := append([]string{"gpt", "--mesh", "tp=2", "--heads", "2", "--dim", "32", "--steps", "1"}, tc.args...)
		code, out, errs := run(t, args...)
		lines := strings.Split(strings.TrimSpace(errs), "\n")
		if code != ExitUsage || !strings.Contains(lines[0], tc.want) || out != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, one line naming %q", tc.args, code, out, errs, ExitUsage, tc.want)
		}
		t.Logf("%v: %s", tc.args, lines[0])
	}
}
