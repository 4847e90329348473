package job

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/models"
)

// TestGPT: `worker gpt` trains on the default corpus over 2 ranks, prints a
// loss per step, the held-out loss beside the unigram entropy, a sample and
// one JSON line; bad arguments fail before any work.
func TestGPT(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	code, out, errs := run(t, "gpt", "--mesh", "tp=2", "--steps", "6", "--dim", "32", "--heads", "2", "--context", "16", "--batch", "4", "--sample", "20")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	for _, want := range []string{"step 1/6 loss ", "step 6/6 loss ", "held-out loss ", "unigram entropy of the text ", "sample:\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r GPTReport
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("last line is not the report: %v\n%s", err, out)
	}
	if r.Vocab < 40 || r.LossFirst <= r.LossLast || r.UnigramEntropy < 2 || r.HeldOutLoss <= 0 || len([]rune(r.Sample)) < 20 {
		t.Errorf("report %+v", r)
	}
	// The throughput at the median step: its 4·16 tokens, and the model's
	// FLOPs in Megatron's count (models.GPTConfig.FlopsPerStep), over the 2
	// ranks.
	flops := models.GPTConfig{Vocab: r.Vocab, Dim: 32, Heads: 2, Layers: 2, Context: 16, Batch: 4}.FlopsPerStep()
	if near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-9*b }; !(r.StepMSMedian > 0) || !near(r.TokensPerS, 64e3/r.StepMSMedian) ||
		!near(r.TFLOPS, flops/r.StepMSMedian/1e9) || !near(r.TFLOPSPerRank, r.TFLOPS/2) || !strings.Contains(out, "throughput: ") {
		t.Errorf("step %v ms: %v tokens/s, %v TFLOP/s (%v a rank); want %v FLOPs a step", r.StepMSMedian, r.TokensPerS, r.TFLOPS, r.TFLOPSPerRank, flops)
	}
	// Megatron's 2 all-reduces per block forward (2 blocks), the embedding's,
	// and the loss's all-gather.
	if r.Collectives["all_reduce y"] != 4 || r.Collectives["all_reduce embedding"] != 1 || r.Collectives["all_gather ce_stats"] != 1 {
		t.Errorf("collectives per step %v", r.Collectives)
	}
	// Mixed precision: bfloat16 activations over float32 parameters.
	code, out, errs = run(t, "gpt", "--mesh", "tp=2", "--dtype", "bfloat16", "--steps", "3", "--dim", "32", "--heads", "2", "--context", "16", "--batch", "4", "--sample", "10")
	if code != 0 || !strings.Contains(out, `"dtype":"bfloat16"`) {
		t.Fatalf("bfloat16: exit %d\n%s%s", code, out, errs)
	}
	tiny := filepath.Join(t.TempDir(), "tiny.txt")
	os.WriteFile(tiny, []byte("abc"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"gpt", "--mesh", "tp=2", "--heads", "3"}, "heads"},
		{[]string{"gpt", "--data", filepath.Join(t.TempDir(), "missing")}, "--data"},
		{[]string{"gpt", "--data", tiny}, "too little text"},
		{[]string{"gpt", "--optimizer", "lion"}, "optimizer"},
		{[]string{"gpt", "--temperature", "0"}, "temperature"},
	} {
		code, _, errs := run(t, tc.args...)
		if code != ExitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d naming %q", tc.args, code, errs, ExitUsage, tc.want)
		}
	}
}

// TestGPTResume: a run saved at step 4 and resumed (parameters and AdamW's
// moments) gives the losses of steps 5 and 6 of a run never stopped; on
// another mesh (tp=1 from tp=2's checkpoint) within float32 rounding.
func TestGPTResume(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	dir := t.TempDir()
	common := []string{"gpt", "--dim", "32", "--heads", "2", "--context", "16", "--batch", "4", "--sample", "0"}
	args := func(extra ...string) []string { return append(append([]string{}, common...), extra...) }
	losses := func(out string) map[string]float64 {
		m := map[string]float64{}
		for _, l := range strings.Split(out, "\n") {
			var s, n int
			var loss, ms float64
			if k, _ := fmt.Sscanf(l, "step %d/%d loss %f time %f ms", &s, &n, &loss, &ms); k == 4 {
				m[fmt.Sprint(s)] = loss
			}
		}
		return m
	}
	code, straight, errs := run(t, args("--mesh", "tp=2", "--steps", "6")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if code, out, errs := run(t, args("--mesh", "tp=2", "--steps", "4", "--save", dir)...); code != 0 || !strings.Contains(out, "saved step 4") {
		t.Fatalf("exit %d: %s%s", code, out, errs)
	}
	want := losses(straight)
	for _, mesh := range []string{"tp=2", "tp=1"} {
		code, out, errs := run(t, args("--mesh", mesh, "--steps", "6", "--resume", dir)...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", mesh, code, errs)
		}
		got := losses(out)
		if _, ok := got["4"]; ok || len(got) != 2 {
			t.Fatalf("%s: resumed run trained steps %v, want 5 and 6", mesh, got)
		}
		for _, s := range []string{"5", "6"} {
			if d := math.Abs(got[s]-want[s]) / want[s]; d > 1e-5 {
				t.Errorf("%s: step %s loss %.6f, the run never stopped %.6f", mesh, s, got[s], want[s])
			}
		}
	}
	// A checkpoint of another model is refused before any work.
	if code, _, errs := run(t, "gpt", "--dim", "64", "--heads", "2", "--steps", "6", "--resume", dir); code != ExitUsage || !strings.Contains(errs, "--resume") {
		t.Errorf("resume into another width: exit %d, %s", code, errs)
	}
}

// TestGPTOpProfile: --op-profile prints, on rank 0's stderr, every kernel
// and collective of the steps after the first, per step, slowest first,
// and the rest of the step as "other", none of them negative; under pp,
// each stage's on its first rank's; mlp's too.
func TestGPTOpProfile(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	code, out, errs := run(t, "gpt", "--mesh", "tp=2", "--steps", "4", "--dim", "32", "--heads", "2", "--context", "16", "--batch", "4", "--sample", "0", "--op-profile")
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	_, table, ok := strings.Cut(errs, "op profile: 3 steps, ")
	if !ok || strings.Count(errs, "op profile:") != 1 {
		t.Fatalf("no single profile of 3 steps on stderr:\n%s", errs)
	}
	var step float64
	fmt.Sscanf(table, "%f ms a step", &step)
	rows := map[string]bool{}
	prev := math.Inf(1)
	for _, l := range strings.Split(table, "\n")[2:] {
		f := strings.Fields(l)
		if len(f) < 4 {
			continue
		}
		ms, _ := strconv.ParseFloat(f[len(f)-2], 64)
		rows[f[0]+" "+f[1]] = true
		if f[0] != "other" && ms > prev {
			t.Errorf("row %q out of order (after %.3f ms)", l, prev)
		}
		prev = ms
	}
	for _, want := range []string{"attention kernel", "attention_backward kernel", "layer_norm kernel", "adamw kernel", "gemm kernel", "y collective", "other host"} {
		if !rows[want] {
			t.Errorf("no %q row in\n%s", want, table)
		}
	}
	if step <= 0 || prev < 0 {
		t.Errorf("a step of %.3f ms, the rest of it %.3f ms:\n%s", step, prev, table)
	}
	// Under pp each stage's first rank prints its stage's: the embedding
	// on the first, the loss on the last.
	code, out, errs = run(t, "gpt", "--mesh", "pp=2,tp=2", "--steps", "4", "--dim", "32", "--heads", "2", "--context", "16", "--batch", "4", "--sample", "0", "--op-profile")
	if code != 0 {
		t.Fatalf("pp=2,tp=2: exit %d\n%s%s", code, out, errs)
	}
	if strings.Count(errs, "op profile") != 2 {
		t.Fatalf("pp=2,tp=2: want two profiles on stderr:\n%s", errs)
	}
	for s, want := range []string{"embedding_backward", "cross_entropy_backward"} {
		_, table, ok := strings.Cut(errs, fmt.Sprintf("op profile of stage %d: 3 steps, ", s))
		if i := strings.Index(table, "op profile"); i >= 0 {
			table = table[:i]
		}
		if !ok || !strings.Contains(table, want+" ") {
			t.Errorf("pp=2,tp=2: stage %d's profile has no %s:\n%s", s, want, errs)
		}
	}
	// mlp prints the same table, its block's kernels and collectives.
	code, out, errs = run(t, "mlp", "--mesh", "tp=2", "--steps", "4", "--tokens", "16", "--hidden", "32", "--op-profile")
	if code != 0 || strings.Count(errs, "op profile: 3 steps, ") != 1 {
		t.Fatalf("mlp: exit %d, want one profile of 3 steps on stderr:\n%s%s", code, out, errs)
	}
	for _, want := range []string{"gemm_bias ", "gelu_backward ", "mse ", "dx ", "other "} {
		if !strings.Contains(errs, "\n"+want) {
			t.Errorf("mlp: no %q row in\n%s", want, errs)
		}
	}
}
