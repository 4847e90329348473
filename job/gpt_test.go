package job

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	// Megatron's 2 all-reduces per block forward (2 blocks), the embedding's,
	// and the loss's all-gather.
	if r.Collectives["all_reduce y"] != 4 || r.Collectives["all_reduce embedding"] != 1 || r.Collectives["all_gather ce_stats"] != 1 {
		t.Errorf("collectives per step %v", r.Collectives)
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
		{[]string{"gpt", "--dtype", "bfloat16"}, "float32"},
		{[]string{"gpt", "--optimizer", "lion"}, "optimizer"},
		{[]string{"gpt", "--temperature", "0"}, "temperature"},
	} {
		code, _, errs := run(t, tc.args...)
		if code != ExitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d naming %q", tc.args, code, errs, ExitUsage, tc.want)
		}
	}
}
