package job

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// gptStepLosses reads each step's loss from a gpt run's output.
func gptStepLosses(out string) map[int]float64 {
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

// TestGPTContextParallel: `worker gpt --mesh cp=2,tp=2` trains on 4 ranks
// (each sequence split over cp in the zigzag layout, ring attention) with
// the losses of tp=2 on the same batches, samples text, and reports the
// bytes its ring sent and the embeddings' and norms' gradients summed over
// cp.
func TestGPTContextParallel(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	args := func(mesh string) []string {
		return []string{"gpt", "--mesh", mesh, "--steps", "8", "--dim", "32", "--heads", "2", "--context", "64", "--batch", "4", "--sample", "20"}
	}
	start := time.Now()
	code, out, errs := run(t, args("cp=2,tp=2")...)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	took := time.Since(start)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r GPTReport
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("last line is not the report: %v\n%s", err, out)
	}
	if r.Mesh != "cp=2,tp=2" || !(r.LossLast < r.LossFirst) || len([]rune(r.Sample)) < 20 || r.HeldOutLoss <= 0 {
		t.Errorf("report %+v", r)
	}
	// Per block, as a ring: each rank's keys and values go around once
	// forward, with their gradients once backward, and the gradients home:
	// 4·(cp−1)·|K,V| bytes, |K,V| = batch·context/cp·heads/tp·(2·dim/heads)
	// float32s. Gathered (the planner's choice at this short context): the
	// keys and values all-gathered forward and again backward, their
	// gradients reduce-scattered: 3·(cp−1)·|K,V|.
	units := map[string]int64{"ring": 4, "gather": 3}[r.CPAttention]
	if kv := int64(4 * 4 * 32 * 1 * 32); units == 0 || r.RingBytesPerStep != 2*units*kv {
		t.Errorf("attention over cp %q: %d B per step, want 2 blocks × %d × %d", r.CPAttention, r.RingBytesPerStep, units, kv)
	}
	if r.Collectives["all_reduce cp_grads"] != 1 || r.Collectives["all_reduce y"] != 4 || r.Collectives["all_reduce embedding"] != 1 {
		t.Errorf("collectives per step %v", r.Collectives)
	}
	code, ref, errs := run(t, args("tp=2")...)
	if code != 0 {
		t.Fatalf("tp=2: exit %d\n%s", code, errs)
	}
	var rr GPTReport
	refLines := strings.Split(strings.TrimSpace(ref), "\n")
	if err := json.Unmarshal([]byte(refLines[len(refLines)-1]), &rr); err != nil {
		t.Fatalf("tp=2: last line is not the report: %v", err)
	}
	// Sampling under cp takes the row from the cp rank holding the
	// position: the same distributions (to float32 rounding) and the same
	// draws give tp=2's text.
	if r.Sample != rr.Sample {
		t.Errorf("cp=2,tp=2 sampled %q, tp=2 %q", r.Sample, rr.Sample)
	}
	got, want := gptStepLosses(out), gptStepLosses(ref)
	var worst float64
	for s := 1; s <= 8; s++ {
		d := math.Abs(got[s]-want[s]) / want[s]
		worst = max(worst, d)
		if d > 1e-4 {
			t.Errorf("step %d: cp=2,tp=2 loss %.6f, tp=2 %.6f", s, got[s], want[s])
		}
	}
	// Mixed precision: q, k and v go to the host and back as bfloat16.
	code, bf, errs := run(t, "gpt", "--mesh", "cp=2,tp=2", "--dtype", "bfloat16", "--steps", "3", "--dim", "32", "--heads", "2", "--context", "64", "--batch", "4", "--sample", "10")
	if code != 0 || !strings.Contains(bf, `"dtype":"bfloat16"`) {
		t.Fatalf("bfloat16: exit %d\n%s%s", code, bf, errs)
	}
	t.Logf("cp=2,tp=2 %s: losses %.4f → %.4f, worst relative difference from tp=2 %.2g, ring %d B/step, %v; sample %q",
		took.Round(time.Millisecond), r.LossFirst, r.LossLast, worst, r.RingBytesPerStep, r.Collectives, r.Sample)
}

// TestGPTContextParallelUsage: what context parallelism refuses is a usage
// error before any work, one line naming what is wrong.
func TestGPTContextParallelUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mesh", "cp=2,tp=2", "--context", "30"}, "context 30 is not a multiple of 2·cp = 4"},
		{[]string{"--mesh", "cp=4", "--context", "36"}, "context 36 is not a multiple of 2·cp = 8"},
		{[]string{"--mesh", "cp=2,tp=2", "--sequence-parallel"}, "does not combine with sequence parallelism"},
		{[]string{"--mesh", "cp=2,tp=2", "--experts", "2"}, "does not combine with experts"},
		{[]string{"--mesh", "tp=2,cp=2"}, "cp=C,tp=N"},
	} {
		args := append([]string{"gpt", "--heads", "2", "--dim", "32", "--steps", "1"}, tc.args...)
		code, out, errs := run(t, args...)
		lines := strings.Split(strings.TrimSpace(errs), "\n")
		if code != ExitUsage || len(lines) != 1 || !strings.Contains(lines[0], tc.want) || out != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, one line naming %q", tc.args, code, out, errs, ExitUsage, tc.want)
		}
		t.Logf("%v: %s", tc.args, lines[0])
	}
}

// TestGPTContextParallelResume: a run saved at step 4 on cp=2,tp=2 and
// resumed on cp=2,tp=2, on tp=2, on cp=4, on dp=2,cp=2 and on dp=2,tp=2,
// and one saved on dp=2,cp=2,tp=2 and resumed on tp=2, cp=4 and dp=2 (the
// parameters are the same tensors, replicated over dp and cp), give the
// losses of a run never stopped.
func TestGPTContextParallelResume(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	args := func(extra ...string) []string {
		return append([]string{"gpt", "--dim", "32", "--heads", "2", "--context", "32", "--batch", "4", "--sample", "0"}, extra...)
	}
	code, straight, errs := run(t, args("--mesh", "cp=2,tp=2", "--steps", "6")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	want := gptStepLosses(straight)
	for _, tc := range []struct {
		saved  string
		meshes []string
	}{
		{"cp=2,tp=2", []string{"cp=2,tp=2", "tp=2", "cp=4", "dp=2,cp=2", "dp=2,tp=2"}},
		{"dp=2,cp=2,tp=2", []string{"tp=2", "cp=4", "dp=2"}},
	} {
		dir := t.TempDir()
		if code, out, errs := run(t, args("--mesh", tc.saved, "--steps", "4", "--save", dir)...); code != 0 || !strings.Contains(out, "saved step 4") {
			t.Fatalf("%s: exit %d: %s%s", tc.saved, code, out, errs)
		}
		for _, mesh := range tc.meshes {
			code, out, errs := run(t, args("--mesh", mesh, "--steps", "6", "--resume", dir)...)
			if code != 0 {
				t.Fatalf("%s from %s: exit %d: %s", mesh, tc.saved, code, errs)
			}
			got := gptStepLosses(out)
			if len(got) != 2 {
				t.Fatalf("%s from %s: resumed run trained steps %v, want 5 and 6", mesh, tc.saved, got)
			}
			for _, s := range []int{5, 6} {
				if d := math.Abs(got[s]-want[s]) / want[s]; d > 1e-5 {
					t.Errorf("%s from %s: step %d loss %.6f, the run never stopped %.6f", mesh, tc.saved, s, got[s], want[s])
				}
			}
		}
	}
}

// TestGPTContextParallelFollowsThePlan: attention over cp runs what the
// planner chose for the block: the keys and values gathered at a short
// context, the ring at a long one, with the bytes of each.
func TestGPTContextParallelFollowsThePlan(t *testing.T) {
	for _, tc := range []struct {
		context int
		mode    string
		units   int64 // |K,V| per block sent by rank 0 in a step
	}{{64, "gather", 3}, {512, "ring", 4}} {
		code, out, errs := run(t, "gpt", "--mesh", "cp=2", "--context", strconv.Itoa(tc.context), "--batch", "2", "--dim", "64", "--heads", "4",
			"--layers", "1", "--steps", "1", "--sample", "0")
		if code != 0 {
			t.Fatalf("context %d: exit %d\n%s", tc.context, code, errs)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		var r GPTReport
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
			t.Fatal(err)
		}
		kv := int64(4 * 2 * tc.context / 2 * 4 * 2 * 16) // batch·context/cp rows, 4 heads, k and v of 16
		if r.CPAttention != tc.mode || r.RingBytesPerStep != tc.units*kv {
			t.Errorf("context %d: attention %q, %d B per step; want %q and %d B", tc.context, r.CPAttention, r.RingBytesPerStep, tc.mode, tc.units*kv)
		}
	}
}
