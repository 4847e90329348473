package launch

import (
	"fmt"
	"io"

	"github.com/meshrun/meshrun/linear/layout"
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

// blockTitles are the headings of the block's ops (layout.MLP.Ops).
var blockTitles = map[string]string{
	"up":   "column-parallel linear (up projection)",
	"gelu": "gelu",
	"down": "row-parallel linear (down projection)",
}

// plan lays out and plans the block (package layout: the layout the mlp
// workload runs).
func (o BlockOptions) plan() ([]layout.Op, error) {
	mesh, err := placement.ParseMesh(o.Mesh)
	if err != nil {
		return nil, fmt.Errorf("--mesh: %w", err)
	}
	if o.Tokens < 1 || o.Hidden < 1 || o.FFN < 1 {
		return nil, fmt.Errorf("--tokens, --hidden and --ffn must be positive")
	}
	l, err := layout.NewMLP(mesh, o.Tokens, o.Hidden, o.FFN, o.SequenceParallel)
	if err != nil {
		return nil, err
	}
	return l.Ops, nil
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
		fmt.Fprintf(w, "== %d. %s\n%s\n", i+1, blockTitles[s.Name], spmd.Text(s.Fwd, s.Bwd, elemSize))
		note("forward", s.Fwd.Collectives())
		note("backward", s.Bwd.Collectives())
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
