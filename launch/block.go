package launch

import (
	"fmt"
	"io"

	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// BlockOptions describe a Megatron MLP block to plan: column-parallel linear ->
// gelu -> row-parallel linear, tokens split over the first mesh dim (data
// parallel) and the ffn dim over the last (tensor parallel).
type BlockOptions struct {
	Mesh                string
	Tokens, Hidden, FFN int
	SequenceParallel    bool
	DType               string // element type the bytes count ("": float32)
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

// blockStage is one op of the block and how it was planned.
type blockStage struct {
	title string
	fwd   *spmd.Plan
	bwd   *spmd.Backward
}

func (o BlockOptions) plan() ([]blockStage, error) {
	mesh, err := placement.ParseMesh(o.Mesh)
	if err != nil {
		return nil, fmt.Errorf("--mesh: %w", err)
	}
	if o.Tokens < 1 || o.Hidden < 1 || o.FFN < 1 {
		return nil, fmt.Errorf("--tokens, --hidden and --ffn must be positive")
	}
	nd := mesh.NDim()
	tp := nd - 1
	// pl builds placements: tokens on the data-parallel dims, tensor dim t on tp.
	pl := func(tokens int, t placement.Placement) []placement.Placement {
		ps := make([]placement.Placement, nd)
		for i := range ps {
			ps[i] = placement.Replicate{}
			if i < tp && tokens >= 0 {
				ps[i] = placement.Shard{Dim: tokens}
			}
		}
		ps[tp] = t
		return ps
	}
	spec := func(shape []int, ps []placement.Placement) placement.Spec {
		return placement.Spec{Shape: shape, Mesh: mesh, Placements: ps}
	}
	x := pl(0, placement.Replicate{})
	out := pl(0, placement.Replicate{})
	if o.SequenceParallel {
		x = pl(0, placement.Shard{Dim: 0})
		out = x
	}
	up := spmd.Request{Op: "linear", Inputs: []spmd.Operand{
		{Name: "x", Spec: spec([]int{o.Tokens, o.Hidden}, x)},
		{Name: "w1", Spec: spec([]int{o.FFN, o.Hidden}, pl(-1, placement.Shard{Dim: 0}))},
		{Name: "b1", Spec: spec([]int{o.FFN}, pl(-1, placement.Shard{Dim: 0}))},
	}, Options: spmd.Options{Output: "h"}}
	var stages []blockStage
	add := func(title string, req spmd.Request) (spmd.Operand, error) {
		fwd, err := spmd.Forward(req)
		if err != nil {
			return spmd.Operand{}, err
		}
		stages = append(stages, blockStage{title: title, fwd: fwd})
		return fwd.Final, nil
	}
	h, err := add("column-parallel linear (up projection)", up)
	if err != nil {
		return nil, err
	}
	g, err := add("gelu", spmd.Request{Op: "gelu", Inputs: []spmd.Operand{{Name: "h", Spec: h.Spec}}, Options: spmd.Options{Output: "g"}})
	if err != nil {
		return nil, err
	}
	_, err = add("row-parallel linear (down projection)", spmd.Request{Op: "linear", Inputs: []spmd.Operand{
		{Name: "g", Spec: g.Spec},
		{Name: "w2", Spec: spec([]int{o.Hidden, o.FFN}, pl(-1, placement.Shard{Dim: 1}))},
		{Name: "b2", Spec: spec([]int{o.Hidden}, pl(-1, placement.Replicate{}))},
	}, Options: spmd.Options{Out: out}})
	if err != nil {
		return nil, err
	}
	for i := range stages {
		if stages[i].bwd, err = spmd.BackwardOf(stages[i].fwd, nil, nil); err != nil {
			return nil, err
		}
	}
	return stages, nil
}

// RunBlock prints the plan of every op of the block and the block's totals.
func RunBlock(w io.Writer, o BlockOptions) error {
	stages, err := o.plan()
	if err != nil {
		return err
	}
	elemSize, err := elemSize(o.DType)
	if err != nil {
		return err
	}
	type tally struct {
		key      string
		n, bytes int64
	}
	count := map[string][]*tally{}
	note := func(phase string, cs []spmd.Collective) {
		for _, c := range cs {
			k := c.Step.Kind.String() + " on"
			for _, d := range c.Step.MeshDims {
				k += " " + c.Step.From.Mesh.DimName(d)
			}
			var t *tally
			for _, x := range count[phase] {
				if x.key == k {
					t = x
				}
			}
			if t == nil {
				t = &tally{key: k}
				count[phase] = append(count[phase], t)
			}
			t.n++
			t.bytes += c.Elems() * int64(elemSize)
		}
	}
	for i, s := range stages {
		fmt.Fprintf(w, "== %d. %s\n%s\n", i+1, s.title, spmd.Text(s.fwd, s.bwd, elemSize))
		note("forward", s.fwd.Collectives())
		note("backward", s.bwd.Collectives())
	}
	fmt.Fprintf(w, "== MLP block on %s: tokens %d, hidden %d, ffn %d, sequence parallel %v\n", o.Mesh, o.Tokens, o.Hidden, o.FFN, o.SequenceParallel)
	for _, phase := range []string{"forward", "backward"} {
		fmt.Fprintf(w, "%s:", phase)
		if len(count[phase]) == 0 {
			fmt.Fprint(w, " no collectives")
		}
		for i, t := range count[phase] {
			sep := ","
			if i == 0 {
				sep = ""
			}
			fmt.Fprintf(w, "%s %d %s (%d B)", sep, t.n, t.key, t.bytes)
		}
		fmt.Fprintln(w)
	}
	return nil
}
