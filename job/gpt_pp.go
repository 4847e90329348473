package job

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/pipeline"
	"github.com/meshrun/meshrun/pipeline/stage"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/runlog"
	"github.com/meshrun/meshrun/tensor"
)

// pipeFlags are worker gpt's pipeline flags.
type pipeFlags struct {
	microBatches int
	chunks       int
	schedule     string
	layers       string
	wire         string
}

func (f *pipeFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.microBatches, "micro-batches", 0, "with pp: split each step's batch into `M` micro-batches, the gradients accumulated over them (0: 2·pp, or the largest divisor of --batch below; --batch a multiple of M)")
	fs.StringVar(&f.schedule, "schedule", "1f1b", "with pp: the pipeline `SCHEDULE`, gpipe, 1f1b, interleaved (Megatron's interleaved 1F1B over --pp-chunks chunks a stage), zb (ZB-H1: the weight gradients deferred into the bubbles) or zb2 (ZB-H2's memory: up to 2·pp−1 micro-batches in flight)")
	fs.IntVar(&f.chunks, "pp-chunks", 0, "with pp and --schedule interleaved: the model's chunks per stage `V` (virtual stages: stage s holds chunks s, s+pp, …; default 2)")
	fs.StringVar(&f.wire, "pp-wire", "device", "with pp on a device: how activations and gradients travel between stages, `device` (device tensors in the compute dtype: NCCL's send and receive between GPUs, staged otherwise) or host (host float32 copies over the transport)")
	fs.StringVar(&f.layers, "pp-layers", "", "with pp: each stage's blocks, e.g. `3,3,2` (each virtual stage's, in order, under interleaved; default: balanced by a count of each stage's multiply-adds, the head's on the last; ties give the last stages more)")
}

// gptPipeline is a GPT split into pipeline stages over the mesh dim pp
// (first): each stage holds its blocks on a mesh of its own (the mesh
// without pp), the embeddings on the first, the final layer norm, the head
// and the loss on the last; a step runs m micro-batches on the schedule.
// Under the interleaved schedule the blocks split into pp·chunks virtual
// stages, stage s holding virtual stages s, s+pp, …, each a chunk.
type gptPipeline struct {
	pp, m, chunks int
	layers        []int // per virtual stage (per stage without chunks)
	kind          pipeline.Kind
	sched         [][]pipeline.Action
	stage         placement.Mesh
	// hostWire: --pp-wire host, host float32 copies between the stages of
	// a device.
	hostWire bool
}

// pipelineOf checks the pipeline flags against mesh and cfg (cfg.Mesh is
// the whole mesh, Batch the step's) and returns the pipeline, nil when mesh
// has no dim pp (then the flags must keep their defaults).
func pipelineOf(mesh placement.Mesh, cfg models.GPTConfig, f pipeFlags) (*gptPipeline, error) {
	pp, stageMesh, ok, err := placement.SplitDim(mesh, "pp")
	if err != nil {
		return nil, fmt.Errorf("--mesh %s: %w", mesh, err)
	}
	if !ok {
		if f.microBatches != 0 || f.layers != "" || f.schedule != "1f1b" || f.wire != "device" || f.chunks != 0 {
			return nil, fmt.Errorf("--micro-batches, --schedule, --pp-chunks, --pp-layers and --pp-wire need a mesh dim pp (e.g. --mesh pp=2,tp=2; pp=1,tp=2 accumulates the gradients of --micro-batches on one stage)")
		}
		return nil, nil
	}
	if i, _ := mesh.DimIndex("pp"); i != 0 {
		return nil, fmt.Errorf("--mesh %s: pp must be the first dim (pp=P or pp=P,tp=N)", mesh)
	}
	if f.wire != "device" && f.wire != "host" {
		return nil, fmt.Errorf("--pp-wire %q: want device or host", f.wire)
	}
	p := &gptPipeline{pp: pp, m: f.microBatches, stage: stageMesh, hostWire: f.wire == "host"}
	if p.kind, err = pipeline.ParseSchedule(f.schedule); err != nil {
		return nil, fmt.Errorf("--schedule %q: want %s", f.schedule, pipeline.Names)
	}
	if p.chunks, err = pipeline.ChunksOf(p.kind, f.chunks); err != nil {
		return nil, err
	}
	if cfg.Layers == 0 {
		return nil, fmt.Errorf("--layers 0 on pp=%d: a stage would have no layer", pp)
	}
	if p.layers, err = pipeline.StageLayers(cfg.Layers, pp, p.chunks, f.layers, splitCost(cfg)); err != nil {
		return nil, err
	}
	if p.m == 0 {
		// 2·pp, or the largest divisor of the batch below it (a multiple
		// of pp under interleaved).
		for p.m = min(2*pp, cfg.Batch); p.m > 1 && (cfg.Batch%p.m != 0 || p.kind.MicroBatchesFit(pp, p.m) != nil); p.m-- {
		}
	}
	if p.m < 1 || p.m > cfg.Batch || cfg.Batch%p.m != 0 {
		return nil, fmt.Errorf("--micro-batches %d: want 1 to --batch %d, dividing it (each micro-batch whole sequences)", p.m, cfg.Batch)
	}
	if err := p.kind.MicroBatchesFit(pp, p.m); err != nil {
		return nil, err
	}
	if p.sched, err = pipeline.ScheduleChunks(p.kind, pp, p.m, p.chunks); err != nil {
		return nil, err
	}
	// A stage's part as its ranks will build it: a micro-batch split over
	// the stage's dp and cp.
	if _, err := models.PlanGPT(p.part(cfg, 0), false); err != nil {
		return nil, fmt.Errorf("--micro-batches %d: %w", p.m, err)
	}
	return p, nil
}

// splitCost prices the GPT's stages for the default split: its MLP is
// 4·D wide.
func splitCost(cfg models.GPTConfig) pipeline.SplitCost {
	return pipeline.TransformerSplitCost(cfg.Dim, 4*cfg.Dim, cfg.Context, cfg.Vocab)
}

// part is virtual stage u's share of the model (stage u's without
// chunks): its config (the stage's mesh, a micro-batch's sequences, the
// step's tokens for the loss) with its blocks.
func (p *gptPipeline) part(cfg models.GPTConfig, u int) models.GPTConfig {
	lo := 0
	for q := range u {
		lo += p.layers[q]
	}
	c := cfg
	c.Mesh, c.Batch, c.LossTokens = p.stage, cfg.Batch/p.m, cfg.Tokens()
	// Each micro-batch's load-balancing loss is its share of the step's
	// objective: the mean over the micro-batches.
	c.AuxCoef = cfg.AuxCoef / float64(p.m)
	c.Part = &models.GPTPart{Lo: lo, Hi: lo + p.layers[u], First: u == 0, Last: u == len(p.layers)-1}
	return c
}

// model builds world rank w's stage: its part of the model (a GPT per
// chunk) on a view of the stage's ranks, and the run that drives it.
func (p *gptPipeline) model(ctx context.Context, cfg models.GPTConfig, w *collective.World, dev *kernels.Dispatcher, tr *tracer) (gptModel, gptRun, *linear.Runtime, error) {
	inner := p.stage.Size()
	s, local := w.Rank()/inner, w.Rank()%inner
	var mine, along []int
	for r := range inner {
		mine = append(mine, s*inner+r)
	}
	for q := range p.pp {
		along = append(along, q*inner+local)
	}
	view, err := w.View(mine)
	if err != nil {
		return nil, nil, nil, err
	}
	var gs gptChunks
	for c := range p.chunks {
		g, err := models.NewGPT(p.part(cfg, pipeline.Virtual(p.pp, s, c)), local, dev)
		if err != nil {
			return nil, nil, nil, err
		}
		gs = append(gs, g)
	}
	r := &ppRun{p: p, cfg: p.part(cfg, s), s: s, local: local, dev: dev, gs: gs, rt: tr.runtime(view, dev), run: tr.run}
	if r.group, err = w.Group(ctx, along); err != nil {
		return nil, nil, nil, err
	}
	if r.all, err = w.WorldGroup(ctx); err != nil {
		return nil, nil, nil, err
	}
	return gs, r, &r.rt, nil
}

// ppRun is one rank's stage of a pipelined GPT.
type ppRun struct {
	p        *gptPipeline
	cfg      models.GPTConfig // the stage's (first) part
	s, local int
	dev      *kernels.Dispatcher
	gs       gptChunks
	rt       linear.Runtime     // as the caller sets it before the first step
	sts      []*models.GPTStage // per chunk
	group    *collective.Group  // the pp group: this rank's peers at the other stages
	all      *collective.Group  // the world
	trace    stage.Trace        // the last step's
	bubbles  []float64          // each step's measured bubble
	overhead []float64          // each step's stage.Trace.Overhead, a share of the step
	replayed []float64          // each step's bubble with every action's own time (pipeline.Cost.Each)
	costs    [][4]float64       // each step's median F, B, W and send (stage.Trace.Costs), ms
	run      *runlog.Rank
}

// PipelineReport is the pipeline of a GPT run (--mesh pp=...): its shape
// and, measured, each stage's bubble (its idle share of the pipeline's step,
// from the first action's start on any stage to the last's end on any:
// waiting for its neighbours, at the start and at the end; stepBubble; the
// median over the steps after the first) and the most micro-batches whose
// activations it held at once.
type PipelineReport struct {
	PP           int    `json:"pp"`
	Schedule     string `json:"schedule"`
	MicroBatches int    `json:"micro_batches"`
	StageLayers  []int  `json:"stage_layers"`
	// Chunks is the chunks per stage (interleaved; else 1), and
	// VirtualStageLayers each virtual stage's layers (with chunks: stage s
	// holds virtual stages s, s+pp, …; StageLayers sums them).
	Chunks             int   `json:"chunks"`
	VirtualStageLayers []int `json:"virtual_stage_layers,omitempty"`
	// BubbleModel is (p−1)/(m+p−1), 1F1B's and GPipe's bubble with equal
	// stages (interleaved over v chunks: (p−1)/(v·m+p−1)).
	BubbleModel     float64   `json:"bubble_model"`
	Bubble          []float64 `json:"bubble"`
	PeakActivations []int     `json:"peak_activations"`
	// ScratchBytes is each stage's memory of micro-batch scratches
	// (models.GPTStage.ScratchBytes, on its first rank): what its peak of
	// micro-batches kept from their forwards to their backwards, as
	// allocated; WorkspaceBytes the workspace they share
	// (GPTStage.WorkBytes).
	ScratchBytes   []int64 `json:"scratch_bytes"`
	WorkspaceBytes []int64 `json:"workspace_bytes"`
	// CostMs is each stage's median F, B and W (a chunk's, with chunks) and
	// SendMs its median send (from an action's end to its send's end;
	// stage.Trace.Costs), in milliseconds, the medians over the steps after
	// the first.
	// BubbleAtCost is each stage's bubble as pipeline.Simulate gives the
	// schedule under those costs (the sends at their mean over the stages):
	// what the schedule gives when every action takes its median time.
	// The measured bubble less it is the noise, not the schedule.
	CostMs       []pipeline.StageCost `json:"cost_ms"`
	SendMs       []float64            `json:"send_ms"`
	BubbleAtCost []float64            `json:"bubble_at_cost"`
	// BubbleReplayed is each stage's bubble with the schedule replayed
	// (pipeline.Simulate, Cost.Each) at every action's own time as it ran
	// and the step's send, the median over the steps after the first: it
	// less BubbleAtCost is the actions' spread about their medians, the
	// measured bubble less it what the runtime added to the actions.
	BubbleReplayed []float64 `json:"bubble_replayed"`
	// Overhead is each stage's own time between its actions
	// (stage.Trace.Overhead: queueing sends, giving inputs back), a share
	// of the step like the bubble, the median over the steps after the
	// first: the part of the bubble the runtime adds; the rest is waiting
	// for the neighbours.
	Overhead []float64 `json:"overhead"`
}

// Text is the report in lines: the schedule, then each stage's layers,
// bubble (and at its median costs), peak and costs.
func (r *PipelineReport) Text() string {
	var b strings.Builder
	if r.Chunks > 1 {
		fmt.Fprintf(&b, "pipeline: %s over pp=%d, %d chunks a stage, %d micro-batches a step (the modelled bubble (p−1)/(v·m+p−1): %.1f%%)\n",
			r.Schedule, r.PP, r.Chunks, r.MicroBatches, 100*r.BubbleModel)
	} else {
		fmt.Fprintf(&b, "pipeline: %s over pp=%d, %d micro-batches a step (1F1B's modelled bubble (p−1)/(m+p−1): %.1f%%)\n",
			r.Schedule, r.PP, r.MicroBatches, 100*r.BubbleModel)
	}
	for s := range r.Bubble {
		layers := "layers"
		if r.StageLayers[s] == 1 {
			layers = "layer"
		}
		fmt.Fprintf(&b, "  stage %d: %d %s", s, r.StageLayers[s], layers)
		if r.Chunks > 1 && len(r.VirtualStageLayers) == r.Chunks*r.PP {
			var parts []string
			for c := range r.Chunks {
				parts = append(parts, strconv.Itoa(r.VirtualStageLayers[pipeline.Virtual(r.PP, s, c)]))
			}
			fmt.Fprintf(&b, " (%s)", strings.Join(parts, "+"))
		}
		fmt.Fprintf(&b, ", bubble %.1f%%", 100*r.Bubble[s])
		if s < len(r.BubbleAtCost) {
			fmt.Fprintf(&b, " (%.1f%% at its median costs", 100*r.BubbleAtCost[s])
			if s < len(r.BubbleReplayed) {
				fmt.Fprintf(&b, ", %.1f%% at its actions' own times", 100*r.BubbleReplayed[s])
			}
			if s < len(r.Overhead) {
				fmt.Fprintf(&b, "; %.2f%% its own between actions", 100*r.Overhead[s])
			}
			b.WriteString(")")
		}
		mbs := "micro-batches"
		if r.PeakActivations[s] == 1 {
			mbs = "micro-batch"
		}
		if r.Chunks > 1 {
			mbs += " of a chunk"
		}
		fmt.Fprintf(&b, ", peak %d %s", r.PeakActivations[s], mbs)
		if s < len(r.ScratchBytes) && s < len(r.WorkspaceBytes) {
			fmt.Fprintf(&b, " (%.1f MiB, and a workspace of %.1f)", float64(r.ScratchBytes[s])/(1<<20), float64(r.WorkspaceBytes[s])/(1<<20))
		}
		if s < len(r.CostMs) {
			c := r.CostMs[s]
			fmt.Fprintf(&b, "; F %.2f, B %.2f, W %.2f ms", c.F, c.B, c.W)
			if r.Chunks > 1 {
				b.WriteString(" a chunk")
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// report gathers the last step's measurements of every stage (a
// collective: every rank calls it).
func (r *ppRun) report(ctx context.Context) (*PipelineReport, error) {
	p := r.p
	v := make([]float64, 11*p.pp)
	b, costs, over, re := slices.Clone(r.bubbles), slices.Clone(r.costs), slices.Clone(r.overhead), slices.Clone(r.replayed)
	if len(b) > 1 {
		b, costs, over, re = b[1:], costs[1:], over[1:], re[1:] // the first step warms up
	}
	v[r.s], v[p.pp+r.s], v[9*p.pp+r.s], v[10*p.pp+r.s] = median(b), float64(r.trace.Peak), median(over), median(re)
	for k := range 4 {
		var ks []float64
		for _, c := range costs {
			ks = append(ks, c[k])
		}
		v[(2+k)*p.pp+r.s] = median(ks)
	}
	for _, st := range r.stages() {
		v[7*p.pp+r.s] += float64(st.ScratchBytes())
		v[8*p.pp+r.s] += float64(st.WorkBytes())
	}
	all, err := r.shared(ctx, v, r.local == 0)
	if err != nil {
		return nil, err
	}
	rep := &PipelineReport{PP: p.pp, Schedule: p.kind.String(), MicroBatches: p.m, Chunks: p.chunks,
		BubbleModel: float64(p.pp-1) / float64(p.chunks*p.m+p.pp-1)}
	rep.StageLayers = make([]int, p.pp)
	for u, n := range p.layers {
		s, _ := pipeline.Place(p.pp, u)
		rep.StageLayers[s] += n
	}
	if p.chunks > 1 {
		rep.VirtualStageLayers = p.layers
	}
	cost := pipeline.Cost{Fused: p.kind.Fused()}
	for s := range p.pp {
		rep.Bubble = append(rep.Bubble, all[s])
		rep.PeakActivations = append(rep.PeakActivations, int(all[p.pp+s]))
		rep.ScratchBytes = append(rep.ScratchBytes, int64(all[7*p.pp+s]))
		rep.WorkspaceBytes = append(rep.WorkspaceBytes, int64(all[8*p.pp+s]))
		rep.Overhead = append(rep.Overhead, all[9*p.pp+s])
		rep.BubbleReplayed = append(rep.BubbleReplayed, all[10*p.pp+s])
		at := func(k int) float64 { return all[(2+k)*p.pp+s] }
		rep.CostMs = append(rep.CostMs, pipeline.StageCost{F: at(0), B: at(1), W: at(2)})
		rep.SendMs = append(rep.SendMs, at(3))
	}
	cost.Stages = rep.CostMs
	for _, x := range rep.SendMs {
		cost.Send += x / float64(p.pp)
	}
	if tl, err := pipeline.Simulate(p.sched, cost); err == nil && tl.Makespan > 0 {
		for _, idle := range tl.Idle {
			rep.BubbleAtCost = append(rep.BubbleAtCost, idle/tl.Makespan)
		}
	}
	return rep, nil
}

// record writes the step's trace into the rank's trace.json: the stage's
// forwards and backwards on one row, its sends on another; t0 is when Run
// began.
func (r *ppRun) record(t0 time.Time, tr stage.Trace) {
	stageArg := runlog.Arg{Key: "stage", Value: strconv.Itoa(r.s)}
	for _, e := range tr.Events {
		r.run.Record(e.Action.String(), "pipeline", 0, t0.Add(e.Start), t0.Add(e.End), stageArg,
			runlog.Arg{Key: "waited", Value: e.Wait.String()})
	}
	for _, x := range tr.Sends {
		r.run.Record(fmt.Sprintf("send %v to stage %d", x.Action, x.To), "pipeline", 1, t0.Add(x.Start), t0.Add(x.End), stageArg)
	}
}

// stages are the model's stage chunks, made on first use, on r.rt as the
// caller sets it (its Record).
func (r *ppRun) stages() []*models.GPTStage {
	if r.sts == nil {
		for _, g := range r.gs {
			st := g.Stage(&r.rt)
			st.SetSplit(!r.p.kind.Fused())
			st.SetDeviceWire(!r.p.hostWire)
			r.sts = append(r.sts, st)
		}
	}
	return r.sts
}

// last is the stage's last chunk: on the last stage, the one with the head
// and the loss.
func (r *ppRun) last() *models.GPTStage { sts := r.stages(); return sts[len(sts)-1] }

// shape is a micro-batch's activation (and gradient) between stages: the
// rank's share of it.
func (r *ppRun) shape(int) []int { return r.stages()[0].Shape() }

// chunks are the stages as package stage runs them; evaluators likewise.
func (r *ppRun) chunks() []stage.Stage {
	var out []stage.Stage
	for _, st := range r.stages() {
		out = append(out, st)
	}
	return out
}

func (r *ppRun) evaluators() []stage.Evaluator {
	var out []stage.Evaluator
	for _, st := range r.stages() {
		out = append(out, st)
	}
	return out
}

// setBatch is GPTStage.SetBatch on every chunk.
func (r *ppRun) setBatch(ids, tgs []*tensor.Tensor, next bool, pos int, temp float64) error {
	for _, st := range r.stages() {
		if err := st.SetBatch(ids, tgs, next, pos, temp); err != nil {
			return err
		}
	}
	return nil
}

// micro uploads micro-batches of the host batch b (each cfg.Tokens() ids
// and targets): the first m, or one.
func (r *ppRun) micro(b gptBatch, m int) (ids, tgs []*tensor.Tensor, err error) {
	n := r.cfg.Tokens()
	for mb := range m {
		for _, src := range []struct {
			from *tensor.Tensor
			into *[]*tensor.Tensor
		}{{b.ids, &ids}, {b.targets, &tgs}} {
			h, err := tensor.FromFloat32(src.from.Float32()[mb*n:(mb+1)*n], n)
			if err != nil {
				return nil, nil, err
			}
			d, err := tensor.Upload(r.dev, h)
			if err != nil {
				return nil, nil, err
			}
			*src.into = append(*src.into, d)
		}
	}
	return ids, tgs, nil
}

// shared sums v over the world, each value given by one rank (this rank's
// when mine): what one stage knows, for every rank.
func (r *ppRun) shared(ctx context.Context, v []float64, mine bool) ([]float64, error) {
	if !mine {
		v = make([]float64, len(v))
	}
	return v, collective.AllReduce(ctx, r.all, v, collective.Sum)
}

// lastOne reports whether the rank gives the last stage's results: its
// first rank.
func (r *ppRun) lastOne() bool { return r.s == r.p.pp-1 && r.local == 0 }

func (r *ppRun) step(ctx context.Context, b gptBatch) (float64, error) {
	ids, tgs, err := r.micro(b, r.p.m)
	if err != nil {
		return 0, err
	}
	for _, st := range r.stages() {
		if err := st.Begin(ids, tgs); err != nil {
			return 0, err
		}
	}
	t0 := time.Now()
	r.trace, err = stage.RunChunks(ctx, r.group, r.p.kind, r.p.sched, r.chunks(), r.shape)
	r.record(t0, r.trace)
	if err != nil {
		return 0, err
	}
	// The loss, and each stage's first start, last end and busy time (its
	// first rank's), on the ranks' clock; its median send and every
	// action's time (ms), for the replay.
	pp, n := r.p.pp, len(r.p.sched[0])
	c, send := r.trace.Costs()
	v := make([]float64, 1+4*pp+pp*n)
	if r.lastOne() {
		v[0] = r.last().Loss()
	}
	if r.local == 0 && len(r.trace.Events) == n {
		v[1+r.s] = float64(t0.Add(r.trace.Events[0].Start).UnixNano())
		v[1+pp+r.s] = float64(t0.Add(r.trace.Makespan).UnixNano())
		v[1+2*pp+r.s] = float64(r.trace.Busy)
		v[1+3*pp+r.s] = send
		for i, e := range r.trace.Events {
			v[1+4*pp+r.s*n+i] = ms(e.End - e.Start)
		}
	}
	if v, err = r.shared(ctx, v, true); err != nil {
		return 0, err
	}
	r.replayed = append(r.replayed, r.replay(v[1+3*pp:1+4*pp], v[1+4*pp:]))
	r.bubbles = append(r.bubbles, stepBubble(v[1:1+pp], v[1+pp:1+2*pp], v[1+2*pp:])[r.s])
	own := 0.0
	if span := stepSpan(v[1:1+pp], v[1+pp:1+2*pp]); span > 0 {
		own = float64(r.trace.Overhead) / span
	}
	r.overhead = append(r.overhead, own)
	r.costs = append(r.costs, [4]float64{c.F, c.B, c.W, send})
	sq := []float64{0} // the gradients' squares, over the stages' chunks and the world
	for _, st := range r.stages() {
		mine, err := st.Reduce(ctx)
		if err != nil {
			return 0, err
		}
		sq[0] += mine
	}
	if r.cfg.ClipGrad > 0 {
		if err := collective.AllReduce(ctx, r.all, sq, collective.Sum); err != nil {
			return 0, fmt.Errorf("gpt: the gradients' norm: %w", err)
		}
	}
	for _, st := range r.stages() {
		if err := st.Finish(ctx, sq[0]); err != nil {
			return 0, err
		}
	}
	return v[0], nil
}

// replay is this stage's bubble in the step replayed (pipeline.Simulate)
// at every stage's actions' own times (each: a stage's n after another's)
// and the stages' mean median send, 0 if it cannot be.
func (r *ppRun) replay(sends, each []float64) float64 {
	pp, n := r.p.pp, len(r.p.sched[0])
	cost := pipeline.Cost{Fused: r.p.kind.Fused(), Each: make([][]float64, pp)}
	for s := range pp {
		cost.Each[s] = each[s*n : (s+1)*n]
		cost.Send += sends[s] / float64(pp)
	}
	tl, err := pipeline.Simulate(r.p.sched, cost)
	if err != nil || tl.Makespan <= 0 {
		return 0
	}
	return tl.Idle[r.s] / tl.Makespan
}

// stepBubble is each stage's bubble in one step: its idle share of the
// pipeline's step, from the first action's start on any stage to the last
// action's end on any (Unix nanoseconds), less its busy time (nanoseconds):
// (p−1)/(m+p−1) for 1F1B at equal costs. The clock is the ranks': one
// machine's, exact; across machines their clocks' offset adds to the step.
func stepBubble(first, last, busy []float64) []float64 {
	span := stepSpan(first, last)
	out := make([]float64, len(busy))
	for s, b := range busy {
		if span > 0 {
			out[s] = 1 - b/span
		}
	}
	return out
}

// stepSpan is the pipeline's step: from the first action's start on any
// stage to the last action's end on any (Unix nanoseconds).
func stepSpan(first, last []float64) float64 { return slices.Max(last) - slices.Min(first) }

func (r *ppRun) loss(ctx context.Context, b gptBatch) (float64, error) {
	ids, tgs, err := r.micro(b, r.p.m)
	if err != nil {
		return 0, err
	}
	if err := r.setBatch(ids, tgs, false, 0, 0); err != nil {
		return 0, err
	}
	if err := stage.ForwardChunks(ctx, r.group, r.p.m, r.evaluators(), r.shape); err != nil {
		return 0, err
	}
	loss, err := r.shared(ctx, []float64{r.last().Loss()}, r.lastOne())
	if err != nil {
		return 0, err
	}
	return loss[0], nil
}

func (r *ppRun) next(ctx context.Context, host *tensor.Tensor, pos int, temp float64) ([]float64, error) {
	ids, tgs, err := r.micro(gptBatch{ids: host, targets: tensor.New(tensor.Float32, host.Len())}, 1)
	if err != nil {
		return nil, err
	}
	if err := r.setBatch(ids, tgs, true, pos, temp); err != nil {
		return nil, err
	}
	if err := stage.ForwardChunks(ctx, r.group, 1, r.evaluators(), r.shape); err != nil {
		return nil, err
	}
	p := r.last().Probs()
	if !r.lastOne() {
		p = make([]float64, r.cfg.Vocab)
	}
	return r.shared(ctx, p, r.lastOne())
}
