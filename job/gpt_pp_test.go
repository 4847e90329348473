package job

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/kernels/sim"
	"github.com/meshrun/meshrun/pipeline"
)

// pipeReport runs worker gpt with args (a small model, 20 steps) and
// returns its report.
func pipeReport(t *testing.T, args ...string) GPTReport {
	t.Helper()
	return pipeReportEnv(t, nil, args...)
}

// pipeReportEnv is pipeReport with the environment variables env set.
func pipeReportEnv(t *testing.T, env map[string]string, args ...string) GPTReport {
	t.Helper()
	base := []string{"gpt", "--steps", "20", "--dim", "32", "--heads", "2", "--context", "16", "--batch", "8", "--layers", "4", "--sample", "10"}
	code, out, errs := runEnv(t, env, append(base, args...)...)
	if code != 0 {
		t.Fatalf("%v: exit %d\n%s%s", args, code, out, errs)
	}
	return gptReport(t, out)
}

// TestGPTPipeline: worker gpt on pp=2, 3 and 4, pp=2,tp=2, pp=2,dp=2 and
// pp=2,cp=2, m = 4 and 8, every schedule, balanced and uneven stages,
// pp=2,tp=2 sequence parallel (against tp=2's) and pp=2,ep=2 with experts
// (dropless, no load-balancing loss), follows pp=1's losses (the first, the 20th, the held-out) within 1e-5
// relative and samples the same text; the report gives each stage's layers,
// bubble and peak activations (measured: m under GPipe, p−s under 1F1B).
func TestGPTPipeline(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	ref := pipeReport(t, "--mesh", "tp=1")
	refSP := pipeReport(t, "--mesh", "tp=2", "--sequence-parallel")
	moe := []string{"--experts", "2", "--top-k", "1", "--aux-coef", "0"} // dropless, no load-balancing loss: the micro-batches' sum is the batch's
	refMoE := pipeReport(t, append([]string{"--mesh", "tp=1"}, moe...)...)
	for _, tc := range []struct {
		mesh, layers string
		want         []int
		ms           []string
		sp, moe      bool
	}{{"pp=2", "", []int{2, 2}, nil, false, false}, {"pp=4", "", []int{1, 1, 1, 1}, nil, false, false}, {"pp=2,tp=2", "", []int{2, 2}, nil, false, false},
		{"pp=2", "3,1", []int{3, 1}, nil, false, false}, {"pp=3", "", []int{1, 2, 1}, nil, false, false},
		{"pp=2,dp=2", "", []int{2, 2}, []string{"2", "4"}, false, false}, {"pp=2,cp=2", "", []int{2, 2}, nil, false, false},
		{"pp=2,tp=2", "", []int{2, 2}, []string{"4"}, true, false}, {"pp=2,ep=2,tp=1", "", []int{2, 2}, []string{"2", "4"}, false, true}} {
		ms := tc.ms
		if ms == nil {
			ms = []string{"4", "8"}
		}
		for _, m := range ms {
			for _, sched := range []string{"gpipe", "1f1b", "zb", "zb2"} {
				args := []string{"--mesh", tc.mesh, "--micro-batches", m, "--schedule", sched}
				if tc.layers != "" {
					args = append(args, "--pp-layers", tc.layers)
				}
				ref := ref
				if tc.sp {
					args, ref = append(args, "--sequence-parallel"), refSP
				}
				if tc.moe {
					args, ref = append(args, moe...), refMoE
				}
				name := strings.Join(args, " ")
				r := pipeReport(t, args...)
				follows(t, name, r, ref)
				p := r.Pipeline
				if p == nil || p.Schedule != sched || fmt.Sprint(p.MicroBatches) != m || fmt.Sprint(p.StageLayers) != fmt.Sprint(tc.want) ||
					len(p.Bubble) != p.PP || len(p.PeakActivations) != p.PP || len(p.ScratchBytes) != p.PP || len(p.WorkspaceBytes) != p.PP ||
					len(p.CostMs) != p.PP || len(p.SendMs) != p.PP || len(p.BubbleAtCost) != p.PP || len(p.Overhead) != p.PP || len(p.BubbleReplayed) != p.PP {
					t.Fatalf("%s: report's pipeline %+v", name, p)
				}
				for s, n := range p.PeakActivations {
					// Measured: GPipe holds all m; 1F1B p−s (p on stage 0), ZB-H1 at
					// most p, ZB-H2 at most 2p−1.
					most := map[string]int{"gpipe": p.MicroBatches, "1f1b": min(p.PP-s, p.MicroBatches), "zb": min(p.PP, p.MicroBatches), "zb2": min(2*p.PP-1, p.MicroBatches)}[sched]
					if n > most || (sched != "zb2" && sched != "zb" && n != most) {
						t.Errorf("%s: stage %d held %d micro-batches at once, want %d at most", name, s, n, most)
					}
				}
				for s, b := range p.Bubble {
					if !(b >= 0 && b < 1) || p.PeakActivations[s] < 1 || p.ScratchBytes[s] <= 0 || p.WorkspaceBytes[s] <= 0 {
						t.Errorf("%s: stage %d: bubble %v, peak %d (%d bytes)", name, s, b, p.PeakActivations[s], p.ScratchBytes[s])
					}
					if c := p.CostMs[s]; !(c.F > 0 && c.B > 0 && c.W >= 0 && p.SendMs[s] >= 0) || !(p.BubbleAtCost[s] >= 0 && p.BubbleAtCost[s] < 1) {
						t.Errorf("%s: stage %d: costs %+v ms, send %v ms, bubble at them %v", name, s, c, p.SendMs[s], p.BubbleAtCost[s])
					}
					if o := p.Overhead[s]; !(o >= 0 && o < 1) {
						t.Errorf("%s: stage %d: its own time between actions %v of the step", name, s, o)
					}
					// Replayed at its actions' own times the step is the
					// one that ran, less the runtime's own time.
					if re := p.BubbleReplayed[s]; !(re >= 0 && re < 1) || re > p.Bubble[s]+0.05 {
						t.Errorf("%s: stage %d: bubble %v, replayed %v", name, s, p.Bubble[s], re)
					}
				}
			}
		}
	}
}

// follows checks that run r (named name) followed ref's losses (the first,
// the last, the held-out) within 1e-5 relative and sampled its text.
func follows(t *testing.T, name string, r, ref GPTReport) {
	t.Helper()
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-5*math.Abs(b) }
	if !near(r.LossFirst, ref.LossFirst) || !near(r.LossLast, ref.LossLast) || !near(r.HeldOutLoss, ref.HeldOutLoss) || r.Sample != ref.Sample {
		t.Errorf("%s: losses %.7f, %.7f, held-out %.7f, sample %q; the reference's: %.7f, %.7f, %.7f, %q", name,
			r.LossFirst, r.LossLast, r.HeldOutLoss, r.Sample, ref.LossFirst, ref.LossLast, ref.HeldOutLoss, ref.Sample)
	}
}

// TestGPTPipelineRefused: what the pipeline does not take exits 2 with
// the reason, before any rank starts.
func TestGPTPipelineRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mesh", "pp=2", "--micro-batches", "3"}, "--micro-batches 3: want 1 to --batch 8, dividing it"},
		{[]string{"--mesh", "pp=2,dp=2", "--micro-batches", "8"}, "--micro-batches 8: linear: bad configuration: gpt: batch 1 is not a multiple of dp = 2"},
		{[]string{"--mesh", "pp=2", "--schedule", "dualpipe"}, `--schedule "dualpipe": want gpipe, 1f1b, interleaved, zb or zb2`},
		{[]string{"--mesh", "pp=2", "--pp-chunks", "2"}, "--pp-chunks 2: only --schedule interleaved runs more than one chunk per stage"},
		{[]string{"--mesh", "pp=2", "--schedule", "interleaved", "--micro-batches", "1"}, "--micro-batches 1: the interleaved schedule wants a multiple of pp=2"},
		{[]string{"--mesh", "pp=4", "--schedule", "interleaved"}, "--layers 4 on pp=4 with 2 chunks a stage: a virtual stage would have no layer"},
		{[]string{"--mesh", "pp=2", "--schedule", "interleaved", "--pp-layers", "2,2"}, "--pp-layers 2,2: 2 stages, want pp × chunks = 4"},
		{[]string{"--mesh", "tp=2", "--pp-chunks", "2"}, "--micro-batches, --schedule, --pp-chunks, --pp-layers and --pp-wire need a mesh dim pp"},
		{[]string{"--mesh", "pp=2", "--pp-layers", "3,3"}, "--pp-layers 3,3: 6 layers, want --layers 4"},
		{[]string{"--mesh", "pp=2", "--pp-layers", "4,0"}, "--pp-layers 4,0: stage 1 has no layer"},
		{[]string{"--mesh", "pp=8"}, "--layers 4 on pp=8: a stage would have no layer"},
		{[]string{"--mesh", "tp=2,pp=2"}, "pp must be the first dim"},
		{[]string{"--mesh", "pp=2,dp=2", "--sequence-parallel"}, "does not combine with sequence parallelism"},
		{[]string{"--micro-batches", "2"}, "need a mesh dim pp"},
	} {
		base := []string{"gpt", "--steps", "2", "--dim", "32", "--heads", "2", "--context", "16", "--batch", "8", "--layers", "4"}
		code, out, errs := run(t, append(base, tc.args...)...)
		if code != ExitUsage || !strings.Contains(errs, tc.want) || out != "" {
			t.Errorf("%v: exit %d, stderr %q, stdout %q; want %d and %q", tc.args, code, errs, out, ExitUsage, tc.want)
		}
	}
}

// TestGPTPipelineResume: a checkpoint saved at pp=4 (each stage its
// parameters and their moments) resumes at pp=2,tp=2 and at pp=1, each
// ending on the losses of the uninterrupted pp=4 run; and a pp=1
// checkpoint resumes at pp=2.
func TestGPTPipelineResume(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-5*math.Abs(b) }
	for _, tc := range []struct{ save, resume string }{{"pp=4", "pp=2,tp=2"}, {"pp=4", "tp=1"}, {"tp=1", "pp=2"},
		{"pp=2 --schedule interleaved", "pp=4"}, {"pp=4", "pp=2 --schedule interleaved"}} {
		dir := t.TempDir()
		whole := pipeReport(t, append(strings.Fields("--mesh "+tc.save), "--save", dir, "--save-every", "10")...)
		got := pipeReport(t, append(strings.Fields("--mesh "+tc.resume), "--resume", dir+"/step-00000010")...)
		if got.FirstStep != 11 || !near(got.LossLast, whole.LossLast) || !near(got.HeldOutLoss, whole.HeldOutLoss) || got.Sample != whole.Sample {
			t.Errorf("saved at %s, resumed at %s from step 10: first step %d, loss %.7f, held-out %.7f, sample %q; uninterrupted: %.7f, %.7f, %q",
				tc.save, tc.resume, got.FirstStep, got.LossLast, got.HeldOutLoss, got.Sample, whole.LossLast, whole.HeldOutLoss, whole.Sample)
		}
	}
}

// TestGPTPipelineDevices: the stages on the sim device (activations
// downloaded to send, uploaded on arrival; through the fake NCCL under
// 1F1B, ZB-H2 and interleaved, staged under interleaved too: two stages
// round a ring) give the cpu stages' losses exactly, and bfloat16 stages
// (the activations sent widened) follow the unsplit bfloat16 model's
// within docs/transformer.md's 1e-2.
func TestGPTPipelineDevices(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	cpu := pipeReport(t, "--mesh", "pp=2,tp=2", "--schedule", "zb")
	// On sim, the stages pass device tensors through the links: staged,
	// and NCCL's send and receive (the fake library, each rank a device
	// of its own); --pp-wire host passes host copies.
	undo := sim.SeparateDevices() // first: a process's sim provider is made once
	fake := map[string]string{"MESHRUN_NCCL_LIBRARY": "fake", "MESHRUN_COLLECTIVES": "nccl"}
	sims := map[string]GPTReport{"nccl": pipeReportEnv(t, fake, "--mesh", "pp=4", "--schedule", "1f1b", "--device", "sim"),
		"nccl zb2": pipeReportEnv(t, fake, "--mesh", "pp=4", "--schedule", "zb2", "--device", "sim"),
		// Two stages round a ring: one link each way carries both.
		"nccl interleaved": pipeReportEnv(t, fake, "--mesh", "pp=2", "--schedule", "interleaved", "--device", "sim")}
	undo()
	sims["staged"] = pipeReport(t, "--mesh", "pp=2,tp=2", "--schedule", "zb", "--device", "sim")
	sims["host"] = pipeReport(t, "--mesh", "pp=2,tp=2", "--schedule", "zb", "--device", "sim", "--pp-wire", "host")
	sims["staged pp=4"] = pipeReport(t, "--mesh", "pp=4", "--schedule", "1f1b", "--device", "sim")
	sims["staged interleaved"] = pipeReport(t, "--mesh", "pp=2", "--schedule", "interleaved", "--device", "sim")
	cpu4, cpu4zb2 := pipeReport(t, "--mesh", "pp=4", "--schedule", "1f1b"), pipeReport(t, "--mesh", "pp=4", "--schedule", "zb2")
	cpuIL := pipeReport(t, "--mesh", "pp=2", "--schedule", "interleaved")
	for name, got := range sims {
		want := cpu
		switch {
		case name == "nccl zb2":
			want = cpu4zb2
		case strings.HasSuffix(name, "interleaved"):
			want = cpuIL
		case strings.Contains(name, "pp=4") || name == "nccl":
			want = cpu4
		}
		if got.LossLast != want.LossLast || got.HeldOutLoss != want.HeldOutLoss || got.Sample != want.Sample {
			t.Errorf("sim, %s: %.9f, %.9f, %q; cpu: %.9f, %.9f, %q", name, got.LossLast, got.HeldOutLoss, got.Sample, want.LossLast, want.HeldOutLoss, want.Sample)
		}
	}
	ref := pipeReport(t, "--mesh", "tp=1", "--dtype", "bfloat16")
	for _, sched := range []string{"1f1b", "zb", "zb2", "interleaved"} {
		got := pipeReport(t, "--mesh", "pp=2", "--dtype", "bfloat16", "--schedule", sched)
		if d := math.Abs(got.LossLast-ref.LossLast) / ref.LossLast; !(d <= 1e-2) || got.DType != "bfloat16" {
			t.Errorf("bfloat16 pp=2 %s: loss %.6f (%s), unsplit %.6f: %.3g relative", sched, got.LossLast, got.DType, ref.LossLast, d)
		}
	}
}

// TestPipelineReportText: the report's lines, a stage's each.
func TestPipelineReportText(t *testing.T) {
	r := &PipelineReport{PP: 2, Schedule: "zb2", MicroBatches: 8, StageLayers: []int{4, 4}, BubbleModel: 1.0 / 9,
		Bubble: []float64{0.1, 0.039}, PeakActivations: []int{3, 3}, ScratchBytes: []int64{3 << 20, 7 << 19}, WorkspaceBytes: []int64{1 << 20, 1 << 19}, CostMs: []pipeline.StageCost{{F: 15.2, B: 16.7, W: 13.9}, {F: 16.6, B: 17.9, W: 14}},
		SendMs: []float64{0.04, 0.05}, BubbleAtCost: []float64{0.085, 0.047}, BubbleReplayed: []float64{0.092, 0.041}, Overhead: []float64{0.0012, 0.0031}}
	want := `pipeline: zb2 over pp=2, 8 micro-batches a step (1F1B's modelled bubble (p−1)/(m+p−1): 11.1%)
  stage 0: 4 layers, bubble 10.0% (8.5% at its median costs, 9.2% at its actions' own times; 0.12% its own between actions), peak 3 micro-batches (3.0 MiB, and a workspace of 1.0); F 15.20, B 16.70, W 13.90 ms
  stage 1: 4 layers, bubble 3.9% (4.7% at its median costs, 4.1% at its actions' own times; 0.31% its own between actions), peak 3 micro-batches (3.5 MiB, and a workspace of 0.5); F 16.60, B 17.90, W 14.00 ms
`
	if got := r.Text(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	// Interleaved: each stage's chunks' layers, micro-batches of a chunk,
	// a chunk's costs, its own model.
	r.Schedule, r.Chunks, r.VirtualStageLayers, r.BubbleModel = "interleaved", 2, []int{2, 1, 2, 3}, 1.0/17
	want = `pipeline: interleaved over pp=2, 2 chunks a stage, 8 micro-batches a step (the modelled bubble (p−1)/(v·m+p−1): 5.9%)
  stage 0: 4 layers (2+2), bubble 10.0% (8.5% at its median costs, 9.2% at its actions' own times; 0.12% its own between actions), peak 3 micro-batches of a chunk (3.0 MiB, and a workspace of 1.0); F 15.20, B 16.70, W 13.90 ms a chunk
  stage 1: 4 layers (1+3), bubble 3.9% (4.7% at its median costs, 4.1% at its actions' own times; 0.31% its own between actions), peak 3 micro-batches of a chunk (3.5 MiB, and a workspace of 0.5); F 16.60, B 17.90, W 14.00 ms a chunk
`
	if got := r.Text(); got != want {
		t.Errorf("interleaved: got\n%s\nwant\n%s", got, want)
	}
}

// TestStepBubble: a stage's bubble is its idle share of the pipeline's
// step, the first start on any stage to the last end on any, on the ranks'
// common clock; 1F1B's at p = 4, m = 8 and unit costs is 3/11 everywhere.
func TestStepBubble(t *testing.T) {
	// Stage s starts at s and ends at 33−s (its cool-down's end), busy 24.
	first, last, busy := []float64{0, 1, 2, 3}, []float64{33, 32, 31, 30}, []float64{24, 24, 24, 24}
	for s, b := range stepBubble(first, last, busy) {
		if math.Abs(b-9.0/33) > 1e-12 {
			t.Errorf("stage %d: bubble %v, want 9/33", s, b)
		}
	}
	// Unequal stages: the slow one's idle share is smaller.
	got := stepBubble([]float64{100, 100}, []float64{200, 150}, []float64{90, 40})
	if math.Abs(got[0]-0.1) > 1e-12 || math.Abs(got[1]-0.6) > 1e-12 {
		t.Errorf("bubbles %v, want [0.1 0.6]", got)
	}
}

// TestGPTPipelineInterleaved: worker gpt under the interleaved 1F1B (2
// chunks a stage, and 4) on pp=2 and 4, pp=2,tp=2 (and sequence parallel),
// pp=2,dp=2, pp=2,cp=2, pp=2,ep=2 with experts and uneven virtual stages
// follows pp=1's losses (the first, the 20th, the held-out) within 1e-5
// relative and samples the same text; the report gives the chunks, each
// virtual stage's layers and each stage's their sum, the bubble
// (p−1)/(v·m+p−1) modelled, and peaks within the schedule's
// 2(p−s−1)+(v−1)p+1 micro-batches of a chunk.
func TestGPTPipelineInterleaved(t *testing.T) {
	if _, err := os.Stat(DefaultCorpus); err != nil {
		t.Skipf("no %s on this machine", DefaultCorpus)
	}
	moe := []string{"--experts", "2", "--top-k", "1", "--aux-coef", "0"}
	refs := map[string]GPTReport{}
	ref := func(args ...string) GPTReport {
		k := strings.Join(args, " ")
		if _, ok := refs[k]; !ok {
			refs[k] = pipeReport(t, args...)
		}
		return refs[k]
	}
	for _, tc := range []struct {
		args   string // besides --mesh and --micro-batches
		mesh   string
		ms     []int
		ref    string // the unsplit run's flags besides --mesh (1f1b: 1F1B's run on the mesh)
		refTP  string // the unsplit run's mesh
		layers []int  // per virtual stage
	}{
		{"", "pp=2", []int{2, 4, 8}, "", "tp=1", []int{1, 1, 1, 1}},
		{"--pp-chunks 4 --layers 8", "pp=2", []int{4}, "--layers 8", "tp=1", []int{1, 1, 1, 1, 1, 1, 1, 1}},
		{"--layers 8", "pp=4", []int{4}, "--layers 8", "tp=1", []int{1, 1, 1, 1, 1, 1, 1, 1}},
		// At 8 micro-batches of an 8-layer model the sums over the
		// micro-batches drift from the unsplit batch's by 2e-5 in 20 steps
		// under every schedule (pp=1 with 8 micro-batches too): against
		// 1F1B's, the same sums in the same order.
		{"--layers 8", "pp=4", []int{8}, "1f1b", "", []int{1, 1, 1, 1, 1, 1, 1, 1}},
		{"--layers 6 --pp-layers 3,1,1,1", "pp=2", []int{4}, "--layers 6", "tp=1", []int{3, 1, 1, 1}},
		{"", "pp=2,tp=2", []int{4}, "", "tp=1", []int{1, 1, 1, 1}},
		{"--sequence-parallel", "pp=2,tp=2", []int{4}, "--sequence-parallel", "tp=2", []int{1, 1, 1, 1}},
		{"", "pp=2,dp=2", []int{2, 4}, "", "tp=1", []int{1, 1, 1, 1}},
		{"", "pp=2,cp=2", []int{4}, "", "tp=1", []int{1, 1, 1, 1}},
		{strings.Join(moe, " "), "pp=2,ep=2,tp=1", []int{2, 4}, strings.Join(moe, " "), "tp=1", []int{1, 1, 1, 1}},
	} {
		for _, m := range tc.ms {
			want := GPTReport{}
			if tc.ref == "1f1b" {
				want = ref(append([]string{"--mesh", tc.mesh, "--schedule", "1f1b", "--micro-batches", fmt.Sprint(m)}, strings.Fields(tc.args)...)...)
			} else {
				want = ref(append([]string{"--mesh", tc.refTP}, strings.Fields(tc.ref)...)...)
			}
			args := append([]string{"--mesh", tc.mesh, "--schedule", "interleaved", "--micro-batches", fmt.Sprint(m)}, strings.Fields(tc.args)...)
			name := strings.Join(args, " ")
			r := pipeReport(t, args...)
			follows(t, name, r, want)
			p := r.Pipeline
			if p == nil {
				t.Fatalf("%s: no pipeline in the report", name)
			}
			v := len(tc.layers) / p.PP
			if p.Schedule != "interleaved" || p.Chunks != v || fmt.Sprint(p.VirtualStageLayers) != fmt.Sprint(tc.layers) || len(p.PeakActivations) != p.PP {
				t.Fatalf("%s: report's pipeline %+v", name, p)
			}
			if bm := float64(p.PP-1) / float64(v*m+p.PP-1); math.Abs(p.BubbleModel-bm) > 1e-12 {
				t.Errorf("%s: modelled bubble %g, want %g", name, p.BubbleModel, bm)
			}
			for s := range p.PP {
				sum := 0
				for c := range v {
					sum += tc.layers[c*p.PP+s]
				}
				if most := 2*(p.PP-s-1) + (v-1)*p.PP + 1; p.StageLayers[s] != sum || p.PeakActivations[s] > most || p.PeakActivations[s] < 1 {
					t.Errorf("%s: stage %d: %d layers (want %d), peak %d (at most %d)", name, s, p.StageLayers[s], sum, p.PeakActivations[s], most)
				}
			}
		}
	}
}
