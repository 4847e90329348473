package planview

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/pipeline"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
)

// Limits of --block transformer's pipeline: what one plan may simulate.
const (
	maxMicroBatches = 1024
	maxLayers       = 1 << 16
	maxPipeActions  = 1 << 18 // stages × chunks × micro-batches × 3
)

// PipelineOptions are the pipeline of --block transformer on a mesh with a
// pp dim: the blocks split into stages over pp, the step into micro-batches.
type PipelineOptions struct {
	Schedule     string // gpipe, 1f1b ("": 1f1b), interleaved, zb or zb2
	MicroBatches int
	// Chunks is the model's chunks per stage under interleaved (0: 2);
	// each stage then holds Chunks virtual stages of layers.
	Chunks int
	// Layers is the blocks of the model (0: one per virtual stage, or the
	// sum of StageLayers); StageLayers, if set, each (virtual) stage's
	// (else balanced).
	Layers      int
	StageLayers string // "3,3,1,1"
	// Vocab, if above 0, is the model's vocabulary: the embeddings priced
	// on the first stage, the head and the loss on the last, in the split
	// and in the timeline, as the GPT prices them (0: blocks alone).
	Vocab int
}

// pipelineFlags are the flags only a pipeline takes.
var pipelineFlags = []string{"schedule", "pp-chunks", "micro-batches", "layers", "pp-layers", "vocab"}

// maxVocab bounds --vocab.
const maxVocab = 1 << 24

// splitCost prices the block and the first and last stages' extras as the
// GPT does (pipeline.TransformerSplitCost) with --vocab; without it, blocks
// alone (the zero value).
func (o BlockOptions) splitCost() pipeline.SplitCost {
	if o.Pipeline.Vocab <= 0 {
		return pipeline.SplitCost{}
	}
	c := o.Context
	if c == 0 {
		c = o.Tokens
	}
	return pipeline.TransformerSplitCost(o.Hidden, o.FFN, c, o.Pipeline.Vocab)
}

// stageMesh splits mesh into pp's size and the mesh of one stage
// (placement.SplitDim).
func stageMesh(mesh placement.Mesh) (pp int, stage placement.Mesh, ok bool, err error) {
	return placement.SplitDim(mesh, "pp")
}

// stageLayers checks the pipeline's flags for pp stages and returns each
// (virtual) stage's layers (balanced under cost unless given), the
// schedule and the chunks per stage.
func (o PipelineOptions) stageLayers(pp int, cost pipeline.SplitCost) ([]int, pipeline.Kind, int, error) {
	name := o.Schedule
	if name == "" {
		name = "1f1b"
	}
	kind, err := pipeline.ParseSchedule(name)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("--schedule %q: want %s", o.Schedule, pipeline.Names)
	}
	v, err := pipeline.ChunksOf(kind, o.Chunks)
	if err != nil {
		return nil, 0, 0, err
	}
	if o.MicroBatches < 1 || o.MicroBatches > maxMicroBatches {
		return nil, 0, 0, fmt.Errorf("--micro-batches %d: want 1 to %d micro-batches per step", o.MicroBatches, maxMicroBatches)
	}
	if err := kind.MicroBatchesFit(pp, o.MicroBatches); err != nil {
		return nil, 0, 0, err
	}
	if pp*v*o.MicroBatches*3 > maxPipeActions {
		return nil, 0, 0, fmt.Errorf("pp=%d with --micro-batches %d: more than %d actions to simulate", pp, o.MicroBatches, maxPipeActions)
	}
	if o.Layers < 0 || o.Layers > maxLayers {
		return nil, 0, 0, fmt.Errorf("--layers %d: want 0 (one per stage) to %d", o.Layers, maxLayers)
	}
	if o.Vocab < 0 || o.Vocab > maxVocab {
		return nil, 0, 0, fmt.Errorf("--vocab %d: want 0 (blocks alone) to %d", o.Vocab, maxVocab)
	}
	per, err := pipeline.StageLayers(o.Layers, pp, v, o.StageLayers, cost)
	return per, kind, v, err
}

// layerCosts are one layer's modelled times of one micro-batch, in seconds:
// F the forward (its compute and collectives), B the gradients of the
// activations (x, q, k, v, ...: what the stage before waits for), W those of
// the parameters (weights, biases, layer norms' scale and shift), each
// gradient as the backward plans it (its compute and collectives); a ring's
// transfers beyond its compute go to F and B.
type layerCosts struct{ F, B, W float64 }

func blockCosts(ops []layout.Op, m placement.Model) layerCosts {
	var c layerCosts
	for _, op := range ops {
		f := op.Fwd.Costs.Forward
		for _, col := range op.Fwd.Collectives() {
			if col.Ring == nil {
				f = placement.SatPicos(f, m.Time(col.Step))
			}
		}
		if op.Fwd.Ring != nil {
			f = placement.SatPicos(f, op.Fwd.Ring.ForwardComm)
		}
		c.F += f.Seconds()
		if op.Bwd == nil {
			continue
		}
		if op.Bwd.Ring != nil {
			c.B += op.Bwd.Ring.BackwardComm.Seconds()
		}
		for _, g := range op.Bwd.Grads {
			if isParam(op.Fwd, g.Input) {
				c.W += g.Plan.Costs.Time.Seconds()
			} else {
				c.B += g.Plan.Costs.Time.Seconds()
			}
		}
	}
	return c
}

// isParam says whether input of fwd is a parameter: a linear's weight and
// bias, a layer norm's scale and shift (every input but the first).
func isParam(fwd *spmd.Plan, input string) bool {
	switch fwd.Op {
	case "linear", "linear_nobias", "layernorm":
		return input != fwd.Inputs[0].Name
	}
	return false
}

// pipelineReport is the pipeline in --json.
type pipelineReport struct {
	MeshDim      string `json:"mesh_dim"`
	Stages       int    `json:"stages"`
	StageMesh    string `json:"stage_mesh"`
	Schedule     string `json:"schedule"`
	Chunks       int    `json:"chunks"`
	MicroBatches int    `json:"micro_batches"`
	StageLayers  []int  `json:"stage_layers"`
	// VirtualStageLayers is each virtual stage's layers with chunks
	// (StageLayers sums a stage's), as worker gpt's report has them.
	VirtualStageLayers []int     `json:"virtual_stage_layers,omitempty"`
	Vocab              int       `json:"vocab,omitempty"`
	LayerF             float64   `json:"layer_forward_s"`
	LayerB             float64   `json:"layer_input_grad_s"`
	LayerW             float64   `json:"layer_weight_grad_s"`
	SendBytes          int64     `json:"send_bytes"`
	Send               float64   `json:"send_s"`
	Step               float64   `json:"step_s"`
	Bubble             float64   `json:"bubble"`
	Idle               []float64 `json:"idle_s"`
	Peak               []int     `json:"peak_activations"`
	PeakInput          []int     `json:"peak_activations_to_b"`
	timeline           pipeline.Timeline
}

// runPipeline times the pipeline of ops (one transformer block on a stage's
// mesh, planned for one micro-batch of tokens) over pp stages.
func runPipeline(o BlockOptions, ops []layout.Op, m placement.Model, elemSize int) (*pipelineReport, error) {
	split := o.splitCost()
	per, kind, v, err := o.Pipeline.stageLayers(o.PP, split)
	if err != nil {
		return nil, err
	}
	c := blockCosts(ops, m)
	// The activation sent between stages: the block's output [tokens,
	// hidden] as each rank of a stage holds it, one message.
	out := ops[len(ops)-1].Fwd.Final.Spec
	bytes := placement.SatMul(out.MaxLocalElems(), int64(elemSize))
	send := m.Alpha + float64(bytes)/m.Beta
	r := &pipelineReport{MeshDim: "pp", Stages: o.PP, StageMesh: o.Mesh, Schedule: kind.String(), Chunks: v, MicroBatches: o.Pipeline.MicroBatches,
		StageLayers: make([]int, o.PP), Vocab: o.Pipeline.Vocab, LayerF: c.F, LayerB: c.B, LayerW: c.W, SendBytes: bytes, Send: send}
	for u, n := range per {
		s, _ := pipeline.Place(o.PP, u)
		r.StageLayers[s] += n
	}
	if v > 1 {
		r.VirtualStageLayers = per
	}
	// The chart counts milliseconds.
	const ms = 1e3
	cost := pipeline.Cost{Send: send * ms}
	for s, n := range per {
		// With --vocab the first and last stages' extras count as blocks
		// in proportion to their multiply-adds.
		blocks := float64(n)
		if split.Block > 0 {
			if s == 0 {
				blocks += split.First / split.Block
			}
			if s == len(per)-1 {
				blocks += split.Last / split.Block
			}
		}
		k := blocks * ms
		cost.Stages = append(cost.Stages, pipeline.StageCost{F: c.F * k, B: c.B * k, W: c.W * k})
	}
	tl, err := pipeline.RunChunks(kind, o.PP, o.Pipeline.MicroBatches, v, cost)
	if err != nil {
		return nil, err
	}
	// A third of the shortest action per column, at most 120 columns.
	unit := math.Inf(1)
	for _, sc := range cost.Stages {
		for _, v := range []float64{sc.F, sc.B, sc.W} {
			if v > 0 {
				unit = min(unit, v)
			}
		}
	}
	unit /= 3
	if math.IsInf(unit, 1) || tl.Makespan/unit > 120 {
		unit = tl.Makespan / 120
	}
	if unit > 0 {
		tl.Unit = unit
	}
	r.timeline = tl
	r.Step, r.Bubble, r.Peak, r.PeakInput = tl.Makespan/ms, tl.Bubble, tl.Peak, tl.PeakInput
	for _, v := range tl.Idle {
		r.Idle = append(r.Idle, v/ms)
	}
	return r, nil
}

// text prints the pipeline after the block's plan.
func (r *pipelineReport) text(w io.Writer, mesh string, tokens int) {
	fmt.Fprintf(w, "== pipeline over pp=%d (mesh %s; each stage runs its blocks on %s): schedule %s, %d micro-batches of %d tokens\n",
		r.Stages, mesh, r.StageMesh, r.Schedule, r.MicroBatches, tokens)
	per := r.StageLayers
	if r.Chunks > 1 {
		per = r.VirtualStageLayers
	}
	layers := make([]string, len(per))
	for i, n := range per {
		layers[i] = strconv.Itoa(n)
	}
	if r.Chunks > 1 {
		fmt.Fprintf(w, "layers per virtual stage: %s (stage s runs virtual stages s, s+%d, …: %d chunks)\n", strings.Join(layers, ", "), r.Stages, r.Chunks)
	} else {
		fmt.Fprintf(w, "layers per stage: %s\n", strings.Join(layers, ", "))
	}
	fmt.Fprintf(w, "modelled per layer and micro-batch: F %s (forward), B %s (activations' gradients), W %s (parameters' gradients); send %s (%d B to the next stage)\n",
		seconds(r.LayerF), seconds(r.LayerB), seconds(r.LayerW), seconds(r.Send), r.SendBytes)
	what := "the per-layer times × its layers"
	if r.Vocab > 0 {
		what += fmt.Sprintf("; the embeddings on the first stage, the head and the loss (vocabulary %d) on the last, as blocks by their multiply-adds", r.Vocab)
	}
	fmt.Fprintf(w, "timeline in ms (a stage's F, B, W: %s):\n%s", what, r.timeline.Text())
}

// seconds prints a time in s, ms or µs.
func seconds(s float64) string {
	switch {
	case s >= 1:
		return fmt.Sprintf("%.3g s", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.3g ms", s*1e3)
	}
	return fmt.Sprintf("%.3g µs", s*1e6)
}

// checkPipeline checks the pipeline's flags against the mesh and the block:
// they need --block transformer and a mesh with a pp dim.
func (o PlanOptions) checkPipeline(mesh placement.Mesh) error {
	pp, _, ok, err := stageMesh(mesh)
	if err != nil {
		return fmt.Errorf("--mesh %s: %w", o.Mesh, err)
	}
	if !ok || o.Block != "transformer" {
		for _, f := range pipelineFlags {
			if o.set[f] {
				return fmt.Errorf("--%s is for --block transformer on a mesh with a pp dim, e.g. --mesh pp=4,tp=2", f)
			}
		}
		return nil
	}
	_, _, _, err = o.Pipeline.stageLayers(pp, o.splitCost())
	return err
}
