package job

import (
	"encoding/json"
	"fmt"
	"math"
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
	if r.Experts != 4 || r.TopK != 2 || r.AuxCoef != 0.01 || r.Mesh != "ep=2,tp=2" || !(r.AuxLossLast > 0) || !(r.BalanceLast > 0) {
		t.Errorf("report %+v", r)
	}
	// Per block, the layer's token rows all-to-all over ep forward and
	// backward, and its router's gradient all-reduced over ep; the
	// embeddings' and layer norms' gradients summed over ep at once.
	if r.Collectives["all_to_all moe_x"] != 2 || r.Collectives["all_to_all moe_dx"] != 2 || r.Collectives["all_reduce moe_drouter"] != 2 || r.Collectives["all_reduce ep_grads"] != 1 {
		t.Errorf("collectives per step %v", r.Collectives)
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

// TestGPTExpertsResume: a mixture-of-experts run saved at step 4 on
// ep=2,tp=2 and resumed (the experts' parameters and AdamW's moments among
// the rest) gives the losses of a run never stopped, on ep=2,tp=2 and on one
// rank.
func TestGPTExpertsResume(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	dir := t.TempDir()
	args := func(extra ...string) []string {
		return append([]string{"gpt", "--experts", "4", "--top-k", "2", "--dim", "32", "--heads", "2", "--context", "16", "--batch", "4", "--sample", "0"}, extra...)
	}
	losses := func(out string) map[int]float64 {
		m := map[int]float64{}
		for _, l := range strings.Split(out, "\n") {
			var s, n int
			var loss, ms float64
			if k, _ := fmt.Sscanf(l, "step %d/%d loss %f time %f ms", &s, &n, &loss, &ms); k == 4 {
				m[s] = loss
			}
		}
		return m
	}
	code, straight, errs := run(t, args("--mesh", "ep=2,tp=2", "--steps", "6")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if code, out, errs := run(t, args("--mesh", "ep=2,tp=2", "--steps", "4", "--save", dir)...); code != 0 || !strings.Contains(out, "saved step 4") {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
	want := losses(straight)
	for _, mesh := range []string{"ep=2,tp=2", "ep=1,tp=1"} {
		code, out, errs := run(t, args("--mesh", mesh, "--steps", "6", "--resume", dir)...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", mesh, code, errs)
		}
		got := losses(out)
		if len(got) != 2 {
			t.Fatalf("%s: resumed run trained steps %v, want 5 and 6", mesh, got)
		}
		for _, s := range []int{5, 6} {
			if d := math.Abs(got[s]-want[s]) / want[s]; d > 1e-5 {
				t.Errorf("%s: step %d loss %.6f, the run never stopped %.6f", mesh, s, got[s], want[s])
			}
		}
	}
}
