package planview

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const pipeArgs = "--block transformer --mesh pp=4,tp=2 --tokens 4096 --context 1024 --hidden 1024 --heads 16 --ffn 4096 --layers 8 --micro-batches 8"

func runPlan(t *testing.T, args string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if code := Main(context.Background(), strings.Fields(args), &out, &errb); code != 0 {
		t.Fatalf("plan %s: exit %d: %s", args, code, errb.String())
	}
	return out.String()
}

// TestPlanPipelineGolden pins `launcher plan --block transformer` on a mesh
// with a pp dim: the block planned on the stage's mesh (tp=2), then the
// pipeline of 8 layers on 4 stages under 1F1B, ZB-H1, ZB-H2 and the
// interleaved 1F1B (two chunks of one layer a stage). ZB-H1's step is
// shorter at the same peak over stages (4, stage 0's); ZB-H2 holds up to 7.
func TestPlanPipelineGolden(t *testing.T) {
	for _, tc := range []struct{ file, schedule, want string }{
		{"transformer-pp4-tp2-1f1b.txt", "1f1b", "peak activations 4 (4 to B)"},
		{"transformer-pp4-tp2-zb.txt", "zb", "layers per stage: 2, 2, 2, 2"},
		{"transformer-pp4-tp2-zb2.txt", "zb2", "peak activations 7 (7 to B)"},
		{"transformer-pp4-tp2-interleaved.txt", "interleaved", "layers per virtual stage: 1, 1, 1, 1, 1, 1, 1, 1 (stage s runs virtual stages s, s+4, …: 2 chunks)"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			args := pipeArgs + " --schedule " + tc.schedule
			out := runPlan(t, args)
			if !strings.Contains(out, "== transformer block on tp=2:") || !strings.Contains(out, tc.want) {
				t.Errorf("no stage mesh or no %q in:\n%s", tc.want, out)
			}
			golden(t, filepath.Join("testdata", "block", tc.file), "$ launcher plan "+args+"\n"+out)
		})
	}
	// The block's plan on pp=4,tp=2 is the plan on tp=2.
	staged, flat := runPlan(t, pipeArgs), runPlan(t, strings.Replace(strings.Split(pipeArgs, " --layers")[0], "pp=4,", "", 1))
	if i := strings.Index(staged, "== pipeline"); i < 0 || staged[:i] != flat {
		t.Errorf("the block's plan on pp=4,tp=2 differs from tp=2's")
	}
}

// TestPlanPipelineModel: the bubbles and step times of the pipeline from
// --json: ZB-H1's idle time under half of 1F1B's, GPipe's step as 1F1B's up to
// the send time, peak activations m for GPipe and at most p for the others;
// --pp-layers 3,3,1,1 makes the first stages the slowest.
func TestPlanPipelineModel(t *testing.T) {
	type pipe struct {
		Mesh     string
		Pipeline struct {
			StageMesh   string    `json:"stage_mesh"`
			StageLayers []int     `json:"stage_layers"`
			Virtual     []int     `json:"virtual_stage_layers"`
			Step        float64   `json:"step_s"`
			Bubble      float64   `json:"bubble"`
			Idle        []float64 `json:"idle_s"`
			Peak        []int     `json:"peak_activations"`
			Send        float64   `json:"send_s"`
		}
	}
	get := func(args string) pipe {
		var r pipe
		if err := json.Unmarshal([]byte(runPlan(t, pipeArgs+" --json "+args)), &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	g, o, z := get("--schedule gpipe"), get("--schedule 1f1b"), get("--schedule zb")
	if o.Mesh != "pp=4,tp=2" || o.Pipeline.StageMesh != "tp=2" || len(o.Pipeline.StageLayers) != 4 {
		t.Errorf("meshes %q, %q, layers %v", o.Mesh, o.Pipeline.StageMesh, o.Pipeline.StageLayers)
	}
	// Here W (272 ms a layer) is shorter than B (414 ms): ZB-H1 waits
	// (p−1)(F+B−W) against 1F1B's (p−1)(F+B+W), under half, though its
	// bubble fraction (0.149 against 0.274) is a little over half, its step
	// being shorter too.
	if z.Pipeline.Idle[0] > 0.5*o.Pipeline.Idle[0] || z.Pipeline.Step >= o.Pipeline.Step || z.Pipeline.Bubble > 0.6*o.Pipeline.Bubble {
		t.Errorf("zb: bubble %g, step %g, idle %v; 1f1b: bubble %g, step %g, idle %v",
			z.Pipeline.Bubble, z.Pipeline.Step, z.Pipeline.Idle, o.Pipeline.Bubble, o.Pipeline.Step, o.Pipeline.Idle)
	}
	if g.Pipeline.Step > o.Pipeline.Step || o.Pipeline.Step-g.Pipeline.Step > 16*o.Pipeline.Send {
		t.Errorf("gpipe's step %g, 1f1b's %g (send %g)", g.Pipeline.Step, o.Pipeline.Step, o.Pipeline.Send)
	}
	for s := 0; s < 4; s++ {
		if g.Pipeline.Peak[s] != 8 || o.Pipeline.Peak[s] != 4-s || z.Pipeline.Peak[s] > 4 {
			t.Errorf("stage %d: peaks gpipe %d, 1f1b %d, zb %d", s, g.Pipeline.Peak[s], o.Pipeline.Peak[s], z.Pipeline.Peak[s])
		}
	}
	// Interleaved over 2 chunks: 8 virtual stages of a layer; the bubble
	// near (p−1)/(v·m+p−1) = 3/19 (the sends add), under 1F1B's 3/11.
	il := get("--schedule interleaved")
	if fmt.Sprint(il.Pipeline.Virtual) != "[1 1 1 1 1 1 1 1]" || fmt.Sprint(il.Pipeline.StageLayers) != "[2 2 2 2]" || il.Pipeline.Step >= o.Pipeline.Step ||
		!(il.Pipeline.Bubble > 3.0/19-0.01 && il.Pipeline.Bubble < 3.0/19+0.03) || il.Pipeline.Peak[0] != 11 {
		t.Errorf("interleaved: layers %v (%v), step %g (1f1b %g), bubble %g, peaks %v", il.Pipeline.Virtual, il.Pipeline.StageLayers, il.Pipeline.Step, o.Pipeline.Step, il.Pipeline.Bubble, il.Pipeline.Peak)
	}
	if il4 := get("--schedule interleaved --pp-chunks 4 --layers 16"); !(il4.Pipeline.Bubble < il.Pipeline.Bubble) || len(il4.Pipeline.Virtual) != 16 {
		t.Errorf("4 chunks: bubble %g (2 chunks %g), layers %v", il4.Pipeline.Bubble, il.Pipeline.Bubble, il4.Pipeline.Virtual)
	}
	u := get("--pp-layers 3,3,1,1")
	if u.Pipeline.Step <= o.Pipeline.Step || u.Pipeline.Idle[3] <= u.Pipeline.Idle[0] {
		t.Errorf("3,3,1,1: step %g (even %g), idle %v", u.Pipeline.Step, o.Pipeline.Step, u.Pipeline.Idle)
	}
	if l := get("--layers 10").Pipeline.StageLayers; len(l) != 4 || l[0] != 2 || l[3] != 3 {
		t.Errorf("10 layers on 4 stages: %v", l)
	}
	// --vocab prices the head and the loss on the last stage, the
	// embeddings on the first, as the GPT does: a vocabulary of 50,257 at
	// width 768 and context 1024 costs the last stage about five blocks,
	// so 12 blocks split 3, 4, 4, 1 (the GPT's split, docs/pipeline.md),
	// and the last stage is the slowest: the least idle.
	gpt2 := "--block transformer --mesh pp=4 --tokens 1024 --context 1024 --hidden 768 --heads 12 --ffn 3072 --layers 12 --json"
	var v pipe
	if err := json.Unmarshal([]byte(runPlan(t, gpt2+" --vocab 50257")), &v); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(v.Pipeline.StageLayers) != "[3 4 4 1]" || slices.Min(v.Pipeline.Idle) != v.Pipeline.Idle[3] {
		t.Errorf("--vocab 50257: layers %v, idle %v; want 3, 4, 4, 1, the last stage the least idle", v.Pipeline.StageLayers, v.Pipeline.Idle)
	}
	var b pipe
	if err := json.Unmarshal([]byte(runPlan(t, gpt2)), &b); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(b.Pipeline.StageLayers) != "[3 3 3 3]" || v.Pipeline.Step <= b.Pipeline.Step {
		t.Errorf("blocks alone: layers %v, step %g (with the head %g)", b.Pipeline.StageLayers, b.Pipeline.Step, v.Pipeline.Step)
	}
	// Without pp, no pipeline.
	if out := runPlan(t, "--block transformer --mesh tp=2 --json"); strings.Contains(out, `"pipeline"`) {
		t.Errorf("a pipeline without pp: %s", out)
	}
}

// TestPlanPipelineRefusals: one line each, exit 2.
func TestPlanPipelineRefusals(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{pipeArgs + " --micro-batches 0", "launcher plan: --micro-batches 0: want 1 to 1024 micro-batches per step\n"},
		{pipeArgs + " --schedule bogus", `launcher plan: --schedule "bogus": want gpipe, 1f1b, interleaved, zb or zb2` + "\n"},
		{pipeArgs + " --pp-layers 3,3,1", "launcher plan: --pp-layers 3,3,1: 3 stages, want pp = 4\n"},
		{pipeArgs + " --pp-layers 3,3,1,2", "launcher plan: --pp-layers 3,3,1,2: 9 layers, want --layers 8\n"},
		{pipeArgs + " --pp-layers 4,4,0,0", "launcher plan: --pp-layers 4,4,0,0: stage 2 has no layer\n"},
		{pipeArgs + " --pp-layers 4,4,,0", `launcher plan: --pp-layers 4,4,,0: "" is not a number of layers` + "\n"},
		{strings.Replace(pipeArgs, "--layers 8", "--layers 3", 1), "launcher plan: --layers 3 on pp=4: a stage would have no layer\n"},
		{"--block transformer --mesh tp=2 --schedule zb", "launcher plan: --schedule is for --block transformer on a mesh with a pp dim, e.g. --mesh pp=4,tp=2\n"},
		{"--block transformer --mesh tp=2 --vocab 65", "launcher plan: --vocab is for --block transformer on a mesh with a pp dim, e.g. --mesh pp=4,tp=2\n"},
		{pipeArgs + " --vocab -1", "launcher plan: --vocab -1: want 0 (blocks alone) to 16777216\n"},
		{pipeArgs + " --pp-chunks 2", "launcher plan: --pp-chunks 2: only --schedule interleaved runs more than one chunk per stage\n"},
		{pipeArgs + " --schedule interleaved --pp-chunks 65", "launcher plan: --pp-chunks 65: want 1 to 64 chunks per stage\n"},
		{strings.Replace(pipeArgs, "--micro-batches 8", "--micro-batches 6", 1) + " --schedule interleaved", "launcher plan: --micro-batches 6: the interleaved schedule wants a multiple of pp=4\n"},
		{strings.Replace(pipeArgs, "--layers 8", "--layers 6", 1) + " --schedule interleaved", "launcher plan: --layers 6 on pp=4 with 2 chunks a stage: a virtual stage would have no layer\n"},
		{pipeArgs + " --schedule interleaved --pp-layers 4,4,0,0", "launcher plan: --pp-layers 4,4,0,0: virtual stage 2 has no layer\n"},
		{pipeArgs + " --schedule interleaved --pp-layers 2,2,2,2", "launcher plan: --pp-layers 2,2,2,2: 4 stages, want pp × chunks = 8\n"},
		{"--block transformer --mesh tp=2 --pp-chunks 2", "launcher plan: --pp-chunks is for --block transformer on a mesh with a pp dim, e.g. --mesh pp=4,tp=2\n"},
		{"--block mlp --mesh pp=2,tp=2 --micro-batches 4", "launcher plan: --micro-batches is for --block transformer on a mesh with a pp dim, e.g. --mesh pp=4,tp=2\n"},
	} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), strings.Fields(tc.args), &out, &errb)
		if code != ExitUsage || out.Len() != 0 || errb.String() != tc.want {
			t.Errorf("plan %s: exit %d, stdout %d B, stderr %q; want %q", tc.args, code, out.Len(), errb.String(), tc.want)
		}
	}
}
