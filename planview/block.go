package planview

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// BlockOptions describe a block to plan: the Megatron MLP block
// (column-parallel linear -> gelu -> row-parallel linear, tokens split over
// the first mesh dims, the ffn dim over the last), or the transformer block
// of worker gpt (Name "transformer", a mesh of dims dp, cp and tp: see
// layout.Transformer; over cp attention may run as a ring).
type BlockOptions struct {
	Name                string // "mlp" ("": mlp) or "transformer"
	Mesh                string
	Tokens, Hidden, FFN int
	// Heads and Context: the transformer's attention heads and sequence
	// length (Context 0: one sequence of Tokens).
	Heads, Context   int
	SequenceParallel bool
	// Experts, TopK and Capacity: block moe's experts, experts per token and
	// capacity factor.
	Experts, TopK int
	Capacity      float64
	DType         string // element type the bytes count ("": float32)
	JSON          bool
	// PP, when above 0, is the stages of a pipeline of Name "transformer"
	// over the dim pp of PipelineMesh: Mesh is then one stage's mesh (without
	// pp), Tokens one micro-batch's, and the plan ends with the pipeline's
	// timeline (docs/pipeline.md).
	PP           int
	PipelineMesh string
	Pipeline     PipelineOptions
}

// elemSize is the size of an element of dtype s ("" is float32).
func elemSize(s string) (int, error) {
	if s == "" {
		return 4, nil
	}
	dt, err := tensor.ParseDType(s)
	if err != nil {
		return 0, fmt.Errorf("--dtype %q: want float32, bfloat16 or float64", s)
	}
	return dt.Size(), nil
}

// blockTitles are the headings of the blocks' ops (layout.MLP.Ops,
// layout.Transformer.Ops).
var blockTitles = map[string]string{
	"up":        "column-parallel linear (up projection)",
	"gelu":      "gelu",
	"down":      "row-parallel linear (down projection)",
	"ln1":       "layer norm (attention input)",
	"qkv":       "column-parallel linear (fused q, k, v projection; whole heads per rank)",
	"attention": "causal attention on this rank's heads",
	"proj":      "row-parallel linear (attention output projection)",
	"add1":      "residual add",
	"ln2":       "layer norm (MLP input)",
	"add2":      "residual add",
}

// plan lays out and plans the block (package layout: the layout the mlp
// and gpt workloads run).
func (o BlockOptions) plan() ([]layout.Op, error) {
	mesh, err := placement.ParseMesh(o.Mesh)
	if err != nil {
		return nil, fmt.Errorf("--mesh: %w", err)
	}
	if o.Tokens < 1 || o.Hidden < 1 || o.FFN < 1 {
		return nil, fmt.Errorf("--tokens, --hidden and --ffn must be positive")
	}
	if o.Name == "transformer" {
		c := o.Context
		if c == 0 {
			c = o.Tokens
		}
		t, err := layout.NewTransformerWith(context.Background(), nil, mesh, o.Tokens, c, o.Heads, o.Hidden, o.FFN, o.SequenceParallel)
		return t.Ops, err
	}
	l, err := layout.NewMLP(mesh, o.Tokens, o.Hidden, o.FFN, o.SequenceParallel)
	if err != nil {
		return nil, err
	}
	return l.Ops, nil
}

// blockTally is the collectives of one kind on some mesh dims in one
// phase of a block.
type blockTally struct {
	Kind     string   `json:"kind"`
	MeshDims []string `json:"mesh_dims"`
	Count    int64    `json:"count"`
	Bytes    int64    `json:"bytes"` // rank 0 passes into them
}

// blockReport is --block's --json: every op's plan and the block's totals.
type blockReport struct {
	Block            string                  `json:"block"`
	Mesh             string                  `json:"mesh"`
	Tokens           int                     `json:"tokens"`
	Hidden           int                     `json:"hidden"`
	FFN              int                     `json:"ffn"`
	Heads            int                     `json:"heads,omitempty"`
	Context          int                     `json:"context,omitempty"`
	SequenceParallel bool                    `json:"sequence_parallel"`
	Ops              []blockOp               `json:"ops"`
	Collectives      map[string][]blockTally `json:"collectives"` // "forward", "backward"
	Pipeline         *pipelineReport         `json:"pipeline,omitempty"`
}

type blockOp struct {
	Name string       `json:"name"`
	Plan *spmd.Report `json:"plan"`
}

// RunBlock prints the plan of every op of the block and the block's totals
// (with JSON, one object).
func RunBlock(w io.Writer, o BlockOptions) error {
	stages, err := o.plan()
	if err != nil {
		return err
	}
	elemSize, err := elemSize(o.DType)
	if err != nil {
		return err
	}
	name := o.Name
	if name == "" {
		name = "mlp"
	}
	r := blockReport{Block: name, Mesh: o.Mesh, Tokens: o.Tokens, Hidden: o.Hidden, FFN: o.FFN, SequenceParallel: o.SequenceParallel,
		Collectives: map[string][]blockTally{"forward": {}, "backward": {}}}
	if name == "transformer" {
		r.Heads, r.Context = o.Heads, o.Context
		if r.Context == 0 {
			r.Context = o.Tokens
		}
	}
	// note tallies collectives; a ring's transfer counts its steps (one
	// send_recv each).
	note := func(phase string, cs []spmd.Collective) {
		for _, c := range cs {
			var dims []string
			for _, d := range c.Step.MeshDims {
				dims = append(dims, c.Step.From.Mesh.DimName(d))
			}
			i := slices.IndexFunc(r.Collectives[phase], func(t blockTally) bool {
				return t.Kind == c.Kind() && slices.Equal(t.MeshDims, dims)
			})
			if i < 0 {
				r.Collectives[phase] = append(r.Collectives[phase], blockTally{Kind: c.Kind(), MeshDims: dims})
				i = len(r.Collectives[phase]) - 1
			}
			r.Collectives[phase][i].Count += int64(c.Count())
			r.Collectives[phase][i].Bytes += c.Elems() * int64(elemSize)
		}
	}
	var rings []string
	for i, s := range stages {
		title := blockTitles[s.Name]
		if rg := s.Fwd.Ring; rg != nil {
			title = "causal ring attention on this rank's heads and sequence block"
			rep := spmd.NewReport(s.Fwd, s.Bwd, elemSize)
			rings = append(rings, fmt.Sprintf("%s: ring attention over %s (%d ranks, zigzag %v): send_recv per rank, forward %d B, backward %d B",
				s.Name, rep.Ring.MeshDim, rg.Size, rg.Zigzag, rep.Ring.ForwardBytes, rep.Ring.BackwardBytes))
		}
		if !o.JSON {
			fmt.Fprintf(w, "== %d. %s\n%s\n", i+1, title, spmd.Text(s.Fwd, s.Bwd, elemSize))
		}
		rep := spmd.NewReport(s.Fwd, s.Bwd, elemSize)
		r.Ops = append(r.Ops, blockOp{Name: s.Name, Plan: &rep})
		note("forward", s.Fwd.Collectives())
		note("backward", s.Bwd.Collectives())
	}
	if o.PP > 0 {
		if r.Pipeline, err = runPipeline(o, stages, stages[0].Fwd.Model, elemSize); err != nil {
			return err
		}
		r.Mesh = o.PipelineMesh
	}
	if o.JSON {
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	if name == "transformer" {
		fmt.Fprintf(w, "== transformer block on %s: tokens %d (context %d), hidden %d, heads %d, ffn %d, sequence parallel %v\n",
			o.Mesh, o.Tokens, r.Context, o.Hidden, o.Heads, o.FFN, o.SequenceParallel)
	} else {
		fmt.Fprintf(w, "== MLP block on %s: tokens %d, hidden %d, ffn %d, sequence parallel %v\n", o.Mesh, o.Tokens, o.Hidden, o.FFN, o.SequenceParallel)
	}
	for _, phase := range []string{"forward", "backward"} {
		fmt.Fprintf(w, "%s:", phase)
		if len(r.Collectives[phase]) == 0 {
			fmt.Fprint(w, " no collectives")
		}
		for i, t := range r.Collectives[phase] {
			sep := ","
			if i == 0 {
				sep = ""
			}
			fmt.Fprintf(w, "%s %d %s on %s (%d B)", sep, t.Count, t.Kind, strings.Join(t.MeshDims, " "), t.Bytes)
		}
		fmt.Fprintln(w)
	}
	for _, l := range rings {
		fmt.Fprintln(w, l)
	}
	if r.Pipeline != nil {
		r.Pipeline.text(w, o.PipelineMesh, o.Tokens)
	}
	return nil
}
