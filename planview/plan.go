package planview

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/meshrun/meshrun/internal/flaghelp"
	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// PlanOptions are the flags of `launcher plan`.
type PlanOptions struct {
	Mesh   string            // "dp=2,tp=2"
	Op     string            // linear, matmul, add, gelu, relu, sum, or redistribute
	Inputs map[string]string // input name -> "SHAPE:[PLACEMENTS]"
	Out    string            // placement the consumer wants for the output, "" for the default
	Grads  string            // "x,w,b", "none", "" for all
	Dims   string            // dims a sum reduces, "0,1"
	World  int               // if > 0, the mesh must hold this many ranks
	JSON   bool
	// Explain lists the chosen forward strategy and this many runners-up with
	// their modelled costs (0: none).
	Explain int
	// Model is a file of the cost model (worker calibrate writes one); ""
	// uses placement.DefaultModel.
	Model string
	// DType is the element type the bytes are counted in ("float32" default,
	// "bfloat16", "float64").
	// Block plans a whole block instead of one op ("mlp").
	Block string
	BlockOptions
	// Draw also draws the plan: "text" (colour where Colour), or "svg"
	// into DrawFile.
	Draw, DrawFile string
	Colour         bool
	// set holds the flags the command line gave.
	set map[string]bool
}

// planInputs are the input flags `launcher plan` knows, by op.
var planInputs = []string{"x", "w", "b", "a", "gamma", "beta", "q", "k", "v", "ids", "table", "m", "target"}

// planInputHelp says which ops take each input flag.
var planInputHelp = map[string]string{
	"x":      "linear, gelu, relu, sum, softmax, layernorm, amax, sumexp, pick; redistribute: the tensor moved",
	"w":      "linear: the weight [N,K]",
	"b":      "linear: the bias [N], optional; add, matmul: the second operand",
	"a":      "add, matmul: the first operand",
	"gamma":  "layernorm: the scale [D]",
	"beta":   "layernorm: the shift [D]",
	"q":      "attention: queries [..., seq, heads, dim]",
	"k":      "attention: keys [..., seq, heads, dim]",
	"v":      "attention: values [..., seq, heads, dim]",
	"ids":    "embedding: token ids [...]",
	"table":  "embedding: the table [vocab, dim]",
	"m":      "sumexp: the rows' maximum [...] (amax of x)",
	"target": "pick: the target ids [...]",
}

const planUsage = `usage: launcher plan --mesh MESH [--op OP] --x SPEC --w SPEC [--b SPEC] [FLAGS]
       launcher plan --mesh MESH --op redistribute --x SPEC --out PLACEMENTS [--json]
       launcher plan --mesh MESH --block mlp|transformer|moe [--tokens N] [--hidden N] [--ffn N] [--heads N] [--context N] [--sequence-parallel] [--experts E --top-k K --capacity-factor C] [--json]
       launcher plan --mesh pp=P,... --block transformer [--schedule gpipe|1f1b|interleaved|zb|zb2] [--pp-chunks V] [--micro-batches M] [--layers L | --pp-layers N,N,...] [--vocab V] [BLOCK FLAGS]
  how an op (or the Megatron MLP block) is sharded: the layouts, collectives and bytes
  of its forward and backward; SPEC is SHAPE:[PLACEMENTS], e.g. 8x16:[S(0),R];
  --op redistribute plans moving the tensor --x to the layout --out: its steps
  and the bytes each moves; a transformer on a mesh with a pp dim is planned on
  the mesh without it (one pipeline stage's) and followed by the pipeline's
  modelled timeline under the schedule (docs/pipeline.md)
`

// planFlags registers the flags of `launcher plan` into o; inputs are the
// --x, --w, --b and --a values, which finish puts into o.Inputs.
func planFlags(o *PlanOptions) (fs *flag.FlagSet, inputs map[string]*string) {
	fs = flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.Mesh, "mesh", "", "device `MESH`: 4 or dp=2,tp=2 (required)")
	fs.StringVar(&o.Op, "op", "linear", "`OP`: "+strings.Join(spmd.Ops(), ", ")+", or redistribute")
	inputs = map[string]*string{}
	for _, n := range planInputs {
		inputs[n] = fs.String(n, "", "input "+n+" as `SPEC`, e.g. 8x16:[S(0),R] ("+planInputHelp[n]+")")
	}
	fs.StringVar(&o.Out, "out", "", "`PLACEMENTS` the consumer wants for the output, e.g. [S(0),S(1)] (default: the op's own; redistribute: required)")
	fs.StringVar(&o.Grads, "grads", "", "`GRADS` wanted: some of the inputs, e.g. x,w, or none (default: all)")
	fs.StringVar(&o.Dims, "dims", "", "`DIMS` a sum reduces, e.g. 0,1 (default: all); softmax: its dim (default: the last)")
	fs.IntVar(&o.World, "world", 0, "check the mesh against this many ranks (default: no check)")
	fs.BoolVar(&o.JSON, "json", false, "print JSON")
	fs.IntVar(&o.Explain, "explain", 0, "also list the chosen strategy and the next `N` cheapest with their modelled costs")
	fs.StringVar(&o.Model, "model", "", "price plans with the cost model in `FILE` (written by worker calibrate; default: the built-in cpu model)")
	fs.StringVar(&o.DType, "dtype", "float32", "element type the bytes count, `DTYPE`: float32, bfloat16 or float64")
	fs.StringVar(&o.Block, "block", "", "plan a `BLOCK` instead of one op: mlp, transformer or moe")
	fs.IntVar(&o.Experts, "experts", 8, "block moe: experts")
	fs.IntVar(&o.TopK, "top-k", 2, "block moe: experts per token")
	fs.Float64Var(&o.Capacity, "capacity-factor", 0, "block moe: capacity factor (0: dropless)")
	fs.IntVar(&o.Heads, "heads", 4, "block transformer: attention heads")
	fs.IntVar(&o.Context, "context", 0, "block transformer: tokens per sequence (default: --tokens, one sequence)")
	fs.IntVar(&o.Tokens, "tokens", 64, "block: tokens")
	fs.IntVar(&o.Hidden, "hidden", 32, "block: hidden size")
	fs.IntVar(&o.FFN, "ffn", 128, "block: ffn size")
	fs.BoolVar(&o.SequenceParallel, "sequence-parallel", false, "block: shard tokens over tp outside the MLP")
	fs.StringVar(&o.Pipeline.Schedule, "schedule", "1f1b", "block transformer on a mesh with a pp dim: the pipeline's `SCHEDULE`, gpipe, 1f1b, interleaved, zb or zb2")
	fs.IntVar(&o.Pipeline.Chunks, "pp-chunks", 0, "block transformer with pp, --schedule interleaved: the model's chunks per stage `V` (virtual stages; default 2)")
	fs.IntVar(&o.Pipeline.MicroBatches, "micro-batches", 8, "block transformer with pp: micro-batches per step (--tokens each)")
	fs.IntVar(&o.Pipeline.Layers, "layers", 0, "block transformer with pp: the model's blocks, split evenly over the stages (default: one per stage)")
	fs.StringVar(&o.Pipeline.StageLayers, "pp-layers", "", "block transformer with pp: each stage's blocks (each virtual stage's, in order, under interleaved), `LAYERS` such as 3,3,1,1 (default: --layers split evenly)")
	fs.IntVar(&o.Pipeline.Vocab, "vocab", 0, "block transformer with pp: the model's vocabulary `V`: the embeddings priced on the first stage, the head and the loss on the last, in the split and the timeline, as the GPT does (0: blocks alone)")
	fs.Var(drawFlag{&o.Draw}, "draw", "also draw each tensor's blocks on the ranks and each collective's move: in text (--draw; coloured on a terminal unless NO_COLOR is set), or --draw svg -o FILE")
	fs.StringVar(&o.DrawFile, "o", "", "with --draw svg: write the SVG to `FILE`")
	return fs, inputs
}

// drawFlag is --draw: alone it draws in text; --draw svg, --draw text (or
// --draw=svg) name the form.
type drawFlag struct{ v *string }

func (f drawFlag) String() string {
	if f.v == nil {
		return ""
	}
	return *f.v
}

func (f drawFlag) Set(s string) error {
	switch s {
	case "true":
		*f.v = "text"
	case "text", "svg":
		*f.v = s
	default:
		return fmt.Errorf("want text or svg, not %q", s)
	}
	return nil
}

func (f drawFlag) IsBoolFlag() bool { return true }

// drawArgs joins "--draw svg" and "--draw text" into one argument: --draw
// alone is a switch, so a form after it would be taken for an argument.
func drawArgs(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if (a == "--draw" || a == "-draw") && i+1 < len(args) && (args[i+1] == "svg" || args[i+1] == "text") {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

// ParsePlanFlags reads `launcher plan` flags. Errors are usage errors;
// flag.ErrHelp for -h.
func ParsePlanFlags(args []string) (PlanOptions, error) {
	o := PlanOptions{Inputs: map[string]string{}}
	fs, in := planFlags(&o)
	if err := fs.Parse(drawArgs(args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, flaghelp.CommandError("launcher plan", fs, err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q (launcher plan -h lists the flags)", fs.Arg(0))
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	for n, v := range in {
		if *v != "" {
			o.Inputs[n] = *v
		}
	}
	return o, nil
}

// planHelp is `launcher plan -h`.
func planHelp() string {
	fs, _ := planFlags(&PlanOptions{})
	return flaghelp.Help(planUsage, fs)
}

// plan is a validated PlanOptions.
type plan struct {
	req   spmd.Request
	grads []string
	json  bool
	dtype tensor.DType
	// redistribute: move req.Inputs[0] to req.Out.
	redistribute bool
}

// Validate checks every flag before any planning and reports the first
// problem: what the planning then refuses (a layout no rule reaches, a mesh
// beyond the planning budget) RunPlan reports before it prints anything.
func (o PlanOptions) Validate() error {
	if _, err := o.model(); err != nil {
		return err
	}
	switch {
	case o.Draw == "svg" && o.DrawFile == "":
		return errors.New("--draw svg needs -o FILE, the SVG to write")
	case o.DrawFile != "" && o.Draw != "svg":
		return errors.New("-o FILE is --draw svg's file")
	case o.Draw != "" && o.JSON:
		return errors.New("--draw and --json: one or the other")
	case o.Draw != "" && (o.Block == "moe" || o.Op == "redistribute"):
		return fmt.Errorf("--draw draws one op (--op) or the blocks mlp and transformer, not %s", cmp.Or(o.Block, o.Op))
	}
	if o.Block != "" {
		_, err := o.block()
		return err
	}
	_, err := o.build()
	return err
}

// block checks the flags of --block and returns the mesh.
func (o PlanOptions) block() (placement.Mesh, error) {
	if o.Block != "mlp" && o.Block != "transformer" && o.Block != "moe" {
		return placement.Mesh{}, fmt.Errorf("--block %q: want mlp, transformer or moe", o.Block)
	}
	if o.Explain != 0 {
		return placement.Mesh{}, errors.New("--explain is for one op, not a --block")
	}
	if _, err := elemSize(o.DType); err != nil {
		return placement.Mesh{}, err
	}
	if o.Mesh == "" {
		return placement.Mesh{}, errors.New("--mesh is required, e.g. --mesh dp=2,tp=2")
	}
	mesh, err := placement.ParseMesh(o.Mesh)
	if err != nil {
		return placement.Mesh{}, fmt.Errorf("--mesh: %w", err)
	}
	if o.World > 0 {
		if err := mesh.Validate(o.World); err != nil {
			return placement.Mesh{}, err
		}
	}
	if o.Tokens < 1 || o.Hidden < 1 || o.FFN < 1 {
		return placement.Mesh{}, fmt.Errorf("--tokens, --hidden and --ffn must be positive")
	}
	if err := layout.CheckSizes(o.Tokens, o.Hidden, o.FFN); err != nil {
		return placement.Mesh{}, err
	}
	if cp, err := mesh.DimIndex("cp"); err == nil {
		// Context parallel splits a sequence: only the transformer has one.
		if o.Block != "transformer" {
			return placement.Mesh{}, fmt.Errorf("--mesh %s: cp splits the sequence, and block %s has none (context parallelism is for --block transformer)", o.Mesh, o.Block)
		}
		if c := o.Context; c < 2*mesh.Dim(cp) && (c > 0 || o.Tokens < 2*mesh.Dim(cp)) {
			if c == 0 {
				c = o.Tokens
			}
			return placement.Mesh{}, fmt.Errorf("--context %d on cp=%d: zigzag ring attention splits a sequence into 2·cp = %d chunks; give a context of %d at least",
				c, mesh.Dim(cp), 2*mesh.Dim(cp), 2*mesh.Dim(cp))
		}
	}
	if o.Block == "moe" {
		if _, err := o.moePlan(mesh); err != nil {
			return placement.Mesh{}, err
		}
	}
	if err := o.checkPipeline(mesh); err != nil {
		return placement.Mesh{}, err
	}
	return mesh, nil
}

// build checks the flags of one op and turns them into a request, without
// planning it.
func (o PlanOptions) build() (plan, error) {
	if o.Mesh == "" {
		return plan{}, errors.New("--mesh is required, e.g. --mesh dp=2,tp=2")
	}
	mesh, err := placement.ParseMesh(o.Mesh)
	if err != nil {
		return plan{}, fmt.Errorf("--mesh: %w", err)
	}
	if o.World > 0 {
		if err := mesh.Validate(o.World); err != nil {
			return plan{}, err
		}
	}
	op := o.Op
	if op == "redistribute" {
		return o.buildRedistribute(mesh)
	}
	names, err := spmd.InputNames(op)
	if err != nil {
		return plan{}, err
	}
	if op == "linear" && o.Inputs["b"] == "" {
		op, names = "linear_nobias", names[:2]
	}
	p := plan{req: spmd.Request{Op: op}, json: o.JSON, dtype: tensor.Float32}
	if o.DType != "" {
		if p.dtype, err = tensor.ParseDType(o.DType); err != nil {
			return plan{}, fmt.Errorf("--dtype %q: want float32, bfloat16 or float64", o.DType)
		}
	}
	for n := range o.Inputs {
		if !slices.Contains(names, n) {
			return plan{}, fmt.Errorf("--%s: %s takes %s", n, o.Op, flagList(names))
		}
	}
	for _, n := range names {
		v, ok := o.Inputs[n]
		if !ok {
			return plan{}, fmt.Errorf("--%s is required: %s takes %s", n, o.Op, flagList(names))
		}
		s, err := placement.ParseSpec(v, mesh)
		if err != nil {
			return plan{}, fmt.Errorf("--%s %s: %w", n, v, err)
		}
		p.req.Inputs = append(p.req.Inputs, spmd.Operand{Name: n, Spec: s})
	}
	if o.Out != "" {
		if p.req.Out, err = placement.ParseList(o.Out); err != nil {
			return plan{}, fmt.Errorf("--out: %w", err)
		}
	}
	if o.Dims != "" {
		for _, d := range strings.Split(o.Dims, ",") {
			n, err := strconv.Atoi(d)
			if err != nil {
				return plan{}, fmt.Errorf("--dims: %q is not a dim", d)
			}
			p.req.Dims = append(p.req.Dims, n)
		}
	}
	switch o.Grads {
	case "":
	case "none":
		p.grads = []string{}
	default:
		p.grads = strings.Split(o.Grads, ",")
		for _, g := range p.grads {
			if !slices.Contains(names, g) {
				return plan{}, fmt.Errorf("--grads: %s has no input %q (inputs: %s)", o.Op, g, strings.Join(names, ", "))
			}
		}
	}
	p.req.Grads = p.grads
	if o.Explain < 0 {
		return plan{}, fmt.Errorf("--explain %d: want the number of runners-up to list, 0 or more", o.Explain)
	}
	p.req.Explain = o.Explain
	return p, nil
}

// RunPlan prints the plan of one op, forward and backward, as a table or JSON,
// or of the MLP block (--block mlp) with an estimate of a rank's memory. An
// interrupt (SIGINT, SIGTERM) stops it at once (RunPlanContext).
func RunPlan(w io.Writer, o PlanOptions) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return RunPlanContext(ctx, w, o)
}

// RunPlanContext is RunPlan within ctx: it plans within one
// placement.DefaultBudget of work (a plan that needs more is an error wrapping
// placement.ErrBudget) and returns as soon as ctx is done. Everything is
// planned before anything is printed: an error leaves w untouched.
func RunPlanContext(ctx context.Context, w io.Writer, o PlanOptions) error {
	m, err := o.model()
	if err != nil {
		return err
	}
	pl := placement.NewPlanner(m, placement.DefaultBudget)
	var out bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- o.run(ctx, pl, &out) }()
	select {
	case err := <-done:
		if err != nil {
			return err
		}
		_, err = w.Write(out.Bytes())
		return err
	case <-ctx.Done():
		// The planners see ctx too and stop; no need to wait for them.
		if cause := context.Cause(ctx); cause != ctx.Err() {
			return fmt.Errorf("interrupted: %w (%w)", cause, ctx.Err())
		}
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
}

// model reads --model (or takes the default) and sets its element size from
// --dtype.
func (o PlanOptions) model() (placement.Model, error) {
	m := placement.DefaultModel
	if o.Model != "" {
		f, err := os.Open(o.Model)
		if err != nil {
			return m, fmt.Errorf("--model: %w", err)
		}
		defer f.Close()
		if m, err = placement.DecodeModel(f, o.Model); err != nil {
			return m, fmt.Errorf("--model: %w", err)
		}
	}
	if n, err := elemSize(o.DType); err == nil {
		m = m.WithElemBytes(n)
	}
	return m, nil
}

// run plans and prints into out.
func (o PlanOptions) run(ctx context.Context, pl *placement.Planner, w io.Writer) error {
	if o.Block != "" {
		return o.runBlock(ctx, pl, w)
	}
	p, err := o.build()
	if err != nil {
		return err
	}
	if p.redistribute {
		return p.runRedistribute(ctx, pl, w)
	}
	fwd, err := spmd.ForwardWith(ctx, pl, p.req)
	if err != nil {
		return err
	}
	bwd, err := spmd.BackwardOfWith(ctx, pl, fwd, p.grads, p.req.Dims)
	if err != nil {
		return err
	}
	elemSize := p.dtype.Size()
	if p.json {
		b, err := json.Marshal(spmd.NewReport(fwd, bwd, elemSize))
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	if _, err = io.WriteString(w, spmd.Text(fwd, bwd, elemSize)); err != nil {
		return err
	}
	return o.draw(w, []drawnOp{{title: fwd.Op + " on mesh " + fwd.Inputs[0].Spec.Mesh.String(), fwd: fwd, bwd: bwd}})
}

// drawnOp is an op of a plan to draw.
type drawnOp struct {
	title string
	fwd   *spmd.Plan
	bwd   *spmd.Backward
}

// draw draws ops as --draw asks: in text on w, or as one SVG into DrawFile.
func (o PlanOptions) draw(w io.Writer, ops []drawnOp) error {
	switch o.Draw {
	case "text":
		for _, op := range ops {
			fmt.Fprintln(w)
			drawOp(w, op.title, op.fwd, op.bwd, o.Colour)
		}
	case "svg":
		var ts []drawn
		var moves []string
		for _, op := range ops {
			t, m := opDrawing(op.fwd, op.bwd)
			for i := range t {
				t[i].name = op.title + ": " + t[i].name
			}
			ts, moves = append(ts, t...), append(moves, m...)
		}
		f, err := os.Create(o.DrawFile)
		if err != nil {
			return err
		}
		title := "launcher plan --mesh " + o.Mesh
		if o.Block != "" {
			title += " --block " + o.Block
		}
		if err := drawSVG(f, title, ts, moves); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		fmt.Fprintf(w, "drawing: %s\n", o.DrawFile)
	}
	return nil
}

// runBlock plans the MLP block within ctx, prints its plan (RunBlock) and the
// memory a rank needs to train it (the worker's mlp refuses to start ranks
// that the machine cannot hold).
func (o PlanOptions) runBlock(ctx context.Context, pl *placement.Planner, w io.Writer) error {
	mesh, err := o.block()
	if err != nil {
		return err
	}
	if o.Block == "moe" {
		return o.runMoE(w, mesh)
	}
	b := o.BlockOptions
	b.Name, b.Mesh, b.DType, b.JSON = o.Block, o.Mesh, o.DType, o.JSON
	if pp, stage, ok, _ := stageMesh(mesh); ok && o.Block == "transformer" {
		// The transformer's layout knows dp, cp and tp: each stage plans
		// its blocks on the mesh without pp.
		b.PP, b.Mesh, b.PipelineMesh = pp, stage.String(), o.Mesh
	}
	if err := RunBlock(w, b); err != nil {
		return err
	}
	if o.Draw != "" {
		ops, err := b.plan()
		if err != nil {
			return err
		}
		var d []drawnOp
		for _, op := range ops {
			d = append(d, drawnOp{title: o.Block + " " + op.Name + " on mesh " + b.Mesh, fwd: op.Fwd, bwd: op.Bwd})
		}
		if err := o.draw(w, d); err != nil {
			return err
		}
	}
	if o.JSON || o.Block == "transformer" {
		return nil
	}
	l, err := layout.NewMLPWith(ctx, pl, mesh, o.Tokens, o.Hidden, o.FFN, o.SequenceParallel)
	if err != nil {
		return err
	}
	dt := tensor.Float32
	if o.DType != "" {
		dt, _ = tensor.ParseDType(o.DType) // checked by block
	}
	_, err = fmt.Fprintf(w, "memory per rank: about %s\n", l.Memory(dt, dt))
	return err
}

func flagList(names []string) string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = "--" + n
	}
	return strings.Join(out, " ")
}

// buildRedistribute checks the flags of --op redistribute: --x the tensor,
// --out the layout it goes to, nothing an op takes.
func (o PlanOptions) buildRedistribute(mesh placement.Mesh) (plan, error) {
	p := plan{redistribute: true, json: o.JSON, dtype: tensor.Float32}
	if o.DType != "" {
		var err error
		if p.dtype, err = tensor.ParseDType(o.DType); err != nil {
			return plan{}, fmt.Errorf("--dtype %q: want float32, bfloat16 or float64", o.DType)
		}
	}
	for n := range o.Inputs {
		if n != "x" {
			return plan{}, fmt.Errorf("--%s: redistribute takes --x (the tensor) and --out (its new placements)", n)
		}
	}
	if o.Grads != "" || o.Dims != "" || o.Explain != 0 {
		return plan{}, errors.New("--grads, --dims and --explain are for ops: redistribute takes --x and --out")
	}
	v, ok := o.Inputs["x"]
	if !ok {
		return plan{}, errors.New("--x is required: redistribute moves the tensor --x, e.g. --x '8x16:[S(0),R]'")
	}
	from, err := placement.ParseSpec(v, mesh)
	if err != nil {
		return plan{}, fmt.Errorf("--x %s: %w", v, err)
	}
	if o.Out == "" {
		return plan{}, errors.New("--out is required: redistribute moves --x to the placements --out, e.g. --out '[R,S(1)]'")
	}
	ps, err := placement.ParseList(o.Out)
	if err != nil {
		return plan{}, fmt.Errorf("--out: %w", err)
	}
	if _, err := placement.NewSpec(from.Shape, mesh, ps...); err != nil {
		return plan{}, fmt.Errorf("--out %s: %w", o.Out, err)
	}
	p.req = spmd.Request{Op: "redistribute", Inputs: []spmd.Operand{{Name: "x", Spec: from}}, Options: spmd.Options{Out: ps}}
	return p, nil
}

// runRedistribute plans the move of p.req.Inputs[0] to p.req.Out and prints it.
func (p plan) runRedistribute(ctx context.Context, pl *placement.Planner, w io.Writer) error {
	from := p.req.Inputs[0].Spec
	to := from.WithPlacements(p.req.Out...)
	steps, err := pl.Plan(ctx, from, to)
	if err != nil {
		return err
	}
	r := spmd.NewRedistReport("x", from, to, steps, pl.Model(), p.dtype.Size())
	if p.json {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	_, err = io.WriteString(w, r.Text())
	return err
}
