package job

import (
	"math"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestGPTRecipe: the gradients clipped to a global norm (--clip-grad) under
// a warmup and a cosine decay (--warmup, --lr-decay cosine, --min-lr) on
// tp=2, sequence parallel, dp=2,tp=2, cp=2, ep=2 with experts, pp=2 (ZB-H1),
// pp=4, pp=2,tp=2 interleaved and pp=2,ep=2 (and bfloat16 tp=2 and pp=2,
// tp=1's bfloat16) follow tp=1's losses and its
// last step's gradient norm within 1e-5 relative: each copy of a parameter
// counted once, every stage's parameters counted; a run resumed half-way
// ends on the same. On tp=1 the clipping
// acts (the norm above it) and changes the losses, and the last step runs
// at the decay's end, --min-lr.
func TestGPTRecipe(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	recipe := []string{"--clip-grad", "0.5", "--warmup", "3", "--lr-decay", "cosine", "--min-lr", "3e-4"}
	moe := []string{"--experts", "2", "--top-k", "1", "--aux-coef", "0"}
	bf16 := []string{"--dtype", "bfloat16"}
	ref := pipeReport(t, append([]string{"--mesh", "tp=1"}, recipe...)...)
	refBF16 := pipeReport(t, append(append([]string{"--mesh", "tp=1"}, recipe...), bf16...)...)
	refMoE := pipeReport(t, append(append([]string{"--mesh", "tp=1"}, recipe...), moe...)...)
	plain := pipeReport(t, "--mesh", "tp=1")
	if ref.ClipGrad != 0.5 || !(ref.GradNormLast > 0.5) || ref.LRLast != 3e-4 || ref.LossLast == plain.LossLast {
		t.Fatalf("tp=1: clip %v, last norm %v, last lr %v, last loss %v (unclipped, no schedule: %v)", ref.ClipGrad, ref.GradNormLast, ref.LRLast, ref.LossLast, plain.LossLast)
	}
	if plain.ClipGrad != 0 || plain.GradNormLast != 0 || plain.LRLast != 0 {
		t.Errorf("without the recipe the report gives clip %v, norm %v, lr %v", plain.ClipGrad, plain.GradNormLast, plain.LRLast)
	}
	for _, args := range [][]string{{"--mesh", "tp=2"}, {"--mesh", "tp=2", "--sequence-parallel"}, {"--mesh", "dp=2,tp=2"}, {"--mesh", "cp=2"},
		{"--mesh", "ep=2,tp=1"}, {"--mesh", "pp=2", "--schedule", "zb"}, {"--mesh", "pp=4"}, {"--mesh", "pp=2,tp=2", "--schedule", "interleaved", "--micro-batches", "4"},
		{"--mesh", "pp=2,ep=2,tp=1"}, {"--mesh", "tp=2", "--dtype", "bfloat16"}, {"--mesh", "pp=2", "--dtype", "bfloat16"}} {
		want := ref
		if strings.Contains(args[1], "ep=") {
			args, want = append(args, moe...), refMoE
		}
		name := strings.Join(args, " ")
		r := pipeReport(t, append(args, recipe...)...)
		tol := 1e-5
		if slices.Contains(args, "bfloat16") {
			// bfloat16 rounds sums taken in another order: docs/transformer.md's
			// bound (measured here: 5e-5 in the losses, 2e-4 in the norm).
			want, tol = refBF16, 1e-2
			if d := math.Abs(r.LossLast-want.LossLast) / want.LossLast; !(d <= tol) {
				t.Errorf("%s: last loss %.7f, tp=1's %.7f", name, r.LossLast, want.LossLast)
			}
		} else {
			follows(t, name, r, want)
		}
		if d := math.Abs(r.GradNormLast-want.GradNormLast) / want.GradNormLast; !(d <= tol) {
			t.Errorf("%s: last step's gradient norm %.7f, tp=1's %.7f", name, r.GradNormLast, want.GradNormLast)
		}
	}
	// Saved at step 10 of pp=2 and resumed at tp=2: the schedule goes on
	// from the checkpoint's step, as if never stopped.
	dir := t.TempDir()
	pipeReport(t, append([]string{"--mesh", "pp=2", "--save", dir, "--save-every", "10"}, recipe...)...)
	r := pipeReport(t, append([]string{"--mesh", "tp=2", "--resume", dir + "/step-00000010"}, recipe...)...)
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-5*math.Abs(b) }
	if r.FirstStep != 11 || r.LRLast != ref.LRLast || !near(r.GradNormLast, ref.GradNormLast) || !near(r.LossLast, ref.LossLast) || !near(r.HeldOutLoss, ref.HeldOutLoss) {
		t.Errorf("resumed at step 11: first step %d, last lr %v, norm %.7f, loss %.7f, held-out %.7f; uninterrupted: %v, %.7f, %.7f, %.7f",
			r.FirstStep, r.LRLast, r.GradNormLast, r.LossLast, r.HeldOutLoss, ref.LRLast, ref.GradNormLast, ref.LossLast, ref.HeldOutLoss)
	}
}

// TestProfilePerRank: --cpuprofile's %r is the launched rank's $RANK, and
// "all" for in-process ranks (one process, one profile).
func TestProfilePerRank(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{{map[string]string{"MESHRUN_NATS_URL": "nats://127.0.0.1:1", "RANK": "3"}, "cpu-3.prof"}, {map[string]string{"RANK": "3"}, "cpu-all.prof"}} {
		stop, err := startProfile(Env{Getenv: func(k string) string { return tc.env[k] }}, dir+"/cpu-%r.prof")
		if err != nil {
			t.Fatal(err)
		}
		stop()
		if st, err := os.Stat(dir + "/" + tc.want); err != nil || st.Size() == 0 {
			t.Errorf("%v: %s: %v", tc.env, tc.want, err)
		}
	}
}

// TestGPTEvalEvery: --eval-every 5 gives the held-out loss after steps 5,
// 10, 15 and 20, the last the final held-out loss, and changes nothing of
// the training: the losses, the final held-out loss and the sample are
// those of the run without it, bit for bit (tp, cp, experts, pipeline
// stages, bfloat16 stages).
func TestGPTEvalEvery(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	for _, args := range [][]string{{"--mesh", "tp=2"}, {"--mesh", "cp=2"}, {"--mesh", "ep=2,tp=1", "--experts", "2"},
		{"--mesh", "pp=2", "--schedule", "zb"}, {"--mesh", "pp=2", "--dtype", "bfloat16"}} {
		name := strings.Join(args, " ")
		plain := pipeReport(t, args...)
		r := pipeReport(t, append(args, "--eval-every", "5")...)
		if r.LossFirst != plain.LossFirst || r.LossLast != plain.LossLast || r.HeldOutLoss != plain.HeldOutLoss || r.Sample != plain.Sample || plain.HeldOutCurve != nil {
			t.Errorf("%s: with --eval-every: losses %v, %v, held-out %v, sample %q; without: %v, %v, %v, %q (curve %v)", name,
				r.LossFirst, r.LossLast, r.HeldOutLoss, r.Sample, plain.LossFirst, plain.LossLast, plain.HeldOutLoss, plain.Sample, plain.HeldOutCurve)
		}
		c := r.HeldOutCurve
		if len(c) != 4 || c[0].Step != 5 || c[3].Step != 20 || c[3].Loss != r.HeldOutLoss || !(c[0].Loss > c[3].Loss) {
			t.Errorf("%s: held-out curve %+v, final %v", name, c, r.HeldOutLoss)
		}
	}
}
