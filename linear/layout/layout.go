// Package layout defines how the linear layers and the Megatron MLP block are
// laid out on a mesh whose last dim is tensor parallel (tp) and whose other
// dims, if any, are data parallel (dp): which placement x, W and b take, and
// which the block's activations take. It is pure (specs in, specs and plans
// out) so that the launcher (`launcher plan --block mlp`) and package linear
// (which runs the block) read the one definition.
package layout

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
)

// ErrUnknown reports a preset name that is not in the table.
var ErrUnknown = errors.New("layout: unknown preset")

// presets are the usual layouts of a linear layer x[M, K] · W[N, K]ᵀ + b[N]. On
// a 1-D mesh there is no dp.
var presets = map[string]struct {
	help string
	// x, w, b: placement on the tp dim; dp dims always shard x's tokens (dim 0)
	// and replicate W and b. out: the output's placement on tp (nil = the
	// rule's default).
	x, w, b, out placement.Placement
	dataParallel bool // every mesh dim, tp included, splits tokens
}{
	"replicated":      {help: "everything replicated, no communication", x: placement.Replicate{}, w: placement.Replicate{}, b: placement.Replicate{}},
	"column":          {help: "Megatron column parallel: W split by output features, y split by columns", x: placement.Replicate{}, w: placement.Shard{Dim: 0}, b: placement.Shard{Dim: 0}},
	"column-gather":   {help: "column parallel with y gathered", x: placement.Replicate{}, w: placement.Shard{Dim: 0}, b: placement.Shard{Dim: 0}, out: placement.Replicate{}},
	"row":             {help: "Megatron row parallel: x and W split by input features, y all-reduced, bias added once", x: placement.Shard{Dim: 1}, w: placement.Shard{Dim: 1}, b: placement.Replicate{}, out: placement.Replicate{}},
	"data-parallel":   {help: "tokens split over every mesh dim, W and b replicated, weight gradients all-reduced", dataParallel: true, w: placement.Replicate{}, b: placement.Replicate{}},
	"sequence-column": {help: "sequence parallel column: tokens split on tp, gathered before the GEMM, dx reduce-scattered", x: placement.Shard{Dim: 0}, w: placement.Shard{Dim: 0}, b: placement.Shard{Dim: 0}},
	"sequence-row":    {help: "sequence parallel row: y reduce-scattered to tokens split on tp", x: placement.Shard{Dim: 1}, w: placement.Shard{Dim: 1}, b: placement.Replicate{}, out: placement.Shard{Dim: 0}},
}

// Presets lists the preset names with a line of help each, sorted.
func Presets() []string {
	var out []string
	for n, p := range presets {
		out = append(out, fmt.Sprintf("%-16s %s", n, p.help))
	}
	sort.Strings(out)
	return out
}

// Layer is the layout of one linear layer y = x·Wᵀ + b.
type Layer struct {
	X, W placement.Spec
	B    *placement.Spec // nil: no bias
	// Out is the placement the consumer wants for y (nil: the rule's default).
	Out []placement.Placement
}

// Preset lays out x[M, K], W[N, K] and b[N] (no bias when bias is false) on
// mesh as the preset name says. On a 2-D mesh such as dp=2,tp=2 it is the
// dp x tp layout: tokens split over dp.
func Preset(name string, mesh placement.Mesh, m, k, n int, bias bool) (Layer, error) {
	p, ok := presets[name]
	if !ok {
		var names []string
		for n := range presets {
			names = append(names, n)
		}
		sort.Strings(names)
		return Layer{}, fmt.Errorf("%w %q (known: %s)", ErrUnknown, name, strings.Join(names, ", "))
	}
	nd := mesh.NDim()
	if nd == 0 {
		return Layer{}, fmt.Errorf("layout: preset %s: the mesh has no dims", name)
	}
	xs, ws, bs := make([]placement.Placement, nd), make([]placement.Placement, nd), make([]placement.Placement, nd)
	for i := 0; i < nd-1; i++ {
		xs[i], ws[i], bs[i] = placement.Shard{Dim: 0}, placement.Replicate{}, placement.Replicate{}
	}
	xs[nd-1], ws[nd-1], bs[nd-1] = p.x, p.w, p.b
	if p.dataParallel {
		xs[nd-1] = placement.Shard{Dim: 0}
	}
	var l Layer
	if p.out != nil {
		l.Out = make([]placement.Placement, nd)
		copy(l.Out, xs[:nd-1])
		l.Out[nd-1] = p.out
	}
	var err error
	if l.X, err = placement.NewSpec([]int{m, k}, mesh, xs...); err != nil {
		return Layer{}, err
	}
	if l.W, err = placement.NewSpec([]int{n, k}, mesh, ws...); err != nil {
		return Layer{}, err
	}
	if bias {
		b, err := placement.NewSpec([]int{n}, mesh, bs...)
		if err != nil {
			return Layer{}, err
		}
		l.B = &b
	}
	return l, nil
}

// MLP is the layout of the Megatron MLP block y = W2·gelu(W1·x + b1) + b2 for
// x[tokens, hidden], W1[ffn, hidden], W2[hidden, ffn]: a column-parallel up
// projection (W1 and b1 split by ffn over tp), gelu on h split by ffn, and a
// row-parallel down projection (W2 split by ffn, b2 replicated, y summed over
// tp); tokens are split over the dp dims. Sequence parallel also splits the
// tokens of x and y over tp: x is all-gathered before the first GEMM and y
// reduce-scattered after the second, instead of y all-reduced.
type MLP struct {
	// Up is x, W1, b1; Down is g (what gelu leaves), W2, b2 and the layout y
	// is wanted in.
	Up, Down Layer
	// Ops are the block's three ops in order ("up", "gelu", "down"), each
	// planned forward and backward (every gradient). Their tensors are named
	// x, w1, b1, h; h, g; g, w2, b2, y.
	Ops []Op
}

// Op is one op of a block, planned.
type Op struct {
	Name string
	Fwd  *spmd.Plan
	Bwd  *spmd.Backward
}

// NewMLP lays out and plans the block on mesh, with a
// placement.DefaultPlanner of its own.
func NewMLP(mesh placement.Mesh, tokens, hidden, ffn int, sequenceParallel bool) (MLP, error) {
	return NewMLPWith(context.Background(), nil, mesh, tokens, hidden, ffn, sequenceParallel)
}

// NewMLPWith is NewMLP with pl (nil: a placement.DefaultPlanner): planning
// stops once ctx is done, and the block's ops share pl's budget and cache.
func NewMLPWith(ctx context.Context, pl *placement.Planner, mesh placement.Mesh, tokens, hidden, ffn int, sequenceParallel bool) (MLP, error) {
	if tokens < 1 || hidden < 1 || ffn < 1 {
		return MLP{}, fmt.Errorf("layout: mlp: tokens %d, hidden %d, ffn %d: each must be positive", tokens, hidden, ffn)
	}
	if err := CheckSizes(tokens, hidden, ffn); err != nil {
		return MLP{}, err
	}
	if pl == nil {
		pl = placement.DefaultPlanner()
	}
	up, down := "column", "row"
	if sequenceParallel {
		up, down = "sequence-column", "sequence-row"
	}
	var m MLP
	var err error
	if m.Up, err = Preset(up, mesh, tokens, hidden, ffn, true); err != nil {
		return MLP{}, err
	}
	if m.Down, err = Preset(down, mesh, tokens, ffn, hidden, true); err != nil {
		return MLP{}, err
	}
	plan := func(name string, req spmd.Request) (placement.Spec, error) {
		fwd, err := spmd.ForwardWith(ctx, pl, req)
		if err != nil {
			return placement.Spec{}, err
		}
		bwd, err := spmd.BackwardOfWith(ctx, pl, fwd, nil, nil)
		if err != nil {
			return placement.Spec{}, err
		}
		m.Ops = append(m.Ops, Op{Name: name, Fwd: fwd, Bwd: bwd})
		return fwd.Final.Spec, nil
	}
	h, err := plan("up", spmd.Request{Op: "linear", Inputs: []spmd.Operand{
		{Name: "x", Spec: m.Up.X}, {Name: "w1", Spec: m.Up.W}, {Name: "b1", Spec: *m.Up.B},
	}, Options: spmd.Options{Output: "h", Out: m.Up.Out}})
	if err != nil {
		return MLP{}, err
	}
	if m.Down.X, err = plan("gelu", spmd.Request{Op: "gelu", Inputs: []spmd.Operand{{Name: "h", Spec: h}}, Options: spmd.Options{Output: "g"}}); err != nil {
		return MLP{}, err
	}
	if _, err = plan("down", spmd.Request{Op: "linear", Inputs: []spmd.Operand{
		{Name: "g", Spec: m.Down.X}, {Name: "w2", Spec: m.Down.W}, {Name: "b2", Spec: *m.Down.B},
	}, Options: spmd.Options{Out: m.Down.Out}}); err != nil {
		return MLP{}, err
	}
	// The gradient down's backward hands gelu must be the one gelu's backward
	// takes: no move between them.
	if dg, want := m.Ops[2].Bwd.Grads[0].Final.Spec, m.Ops[1].Bwd.DY.Spec; !dg.Equal(want) {
		return MLP{}, fmt.Errorf("layout: mlp: down's dg %s does not meet gelu's dg %s", dg, want)
	}
	return m, nil
}

// CheckSizes refuses a block one of whose tensors would hold more than
// placement.MaxElems elements, naming the sizes that make it.
func CheckSizes(tokens, hidden, ffn int) error {
	for _, t := range []struct {
		name   string
		a, b   string
		na, nb int
	}{
		{"x", "tokens", "hidden", tokens, hidden},
		{"w1", "ffn", "hidden", ffn, hidden},
		{"h", "tokens", "ffn", tokens, ffn},
	} {
		if n, ok := placement.MulSize(int64(t.na), int64(t.nb)); !ok || n > placement.MaxElems {
			return fmt.Errorf("%w: layout mlp: %s [%s %d, %s %d] would hold more than %d elements, the most a tensor may",
				placement.ErrTooLarge, t.name, t.a, t.na, t.b, t.nb, int64(placement.MaxElems))
		}
	}
	return nil
}

// Transformer is the layout of one pre-norm transformer block of
// worker gpt's model, Megatron's: x += proj(attention(qkv(ln1 x))), x +=
// down(gelu(up(ln2 x))) on x[tokens, hidden], tokens = batch × context,
// with qkv and up column-parallel over tp (whole heads per rank), proj and
// down row-parallel, and, sequence parallel, tokens split over tp outside
// the linear layers (layer norms and residual adds on split rows; x
// all-gathered before qkv and up, the outputs reduce-scattered).
//
// The mesh's dims are named dp, cp and tp (each at most once, tp last; a
// 1-D mesh of another name is tp):
//
//   - dp splits the batch: every tensor's rows, attention's batch dim;
//     the parameters' gradients are partial over dp and reduced.
//   - cp splits every sequence (context parallel): each cp rank holds its
//     positions of every sequence of its batch, in zigzag chunks (of 2·cp
//     chunks, rank i holds chunks i and 2·cp−1−i; the runtime permutes the
//     token positions at the embedding and back at the loss, and orders a
//     rank's rows batch by batch, so x[tokens, hidden] split by rows over
//     cp is q[batch, context, heads, head dim] split by context). The
//     linear layers, layer norms, gelu and adds are token-wise: nothing
//     moves over cp forward, and their parameters' gradients are partial
//     over cp and reduced. Attention is planned with ring attention allowed
//     over cp (spmd.Options.Ring): the planner runs it as a ring, or splits
//     the queries and gathers the keys and values, whichever its model
//     prices cheaper.
//   - tp: Megatron's tensor parallelism, as above.
type Transformer struct {
	// Ops are the block's ops in order, each planned forward and backward:
	// ln1, qkv, attention, proj, add1, ln2, up, gelu, down, add2.
	Ops []Op
}

// transformerRoles reads the mesh's dims as dp, cp and tp.
func transformerRoles(mesh placement.Mesh) (dp, cp, tp int, err error) {
	dp, cp, tp = -1, -1, -1
	if mesh.NDim() == 1 && mesh.DimName(0) != "dp" && mesh.DimName(0) != "cp" {
		return -1, -1, 0, nil
	}
	for i := 0; i < mesh.NDim(); i++ {
		at := map[string]*int{"dp": &dp, "cp": &cp, "tp": &tp}[mesh.DimName(i)]
		if at == nil || *at >= 0 {
			return 0, 0, 0, fmt.Errorf("layout: transformer: mesh %s: its dims must be named dp, cp and tp, each at most once", mesh)
		}
		*at = i
	}
	if tp >= 0 && tp != mesh.NDim()-1 {
		return 0, 0, 0, fmt.Errorf("layout: transformer: mesh %s: tp must be the last dim", mesh)
	}
	return dp, cp, tp, nil
}

// NewTransformerWith lays out and plans one block on a mesh of dims dp, cp
// and tp (see Transformer) with pl (nil: a placement.DefaultPlanner):
// planning stops once ctx is done, and the block's ops share pl's budget
// and cache.
func NewTransformerWith(ctx context.Context, pl *placement.Planner, mesh placement.Mesh, tokens, context, heads, hidden, ffn int, sequenceParallel bool) (Transformer, error) {
	dp, cp, tp, err := transformerRoles(mesh)
	if err != nil {
		return Transformer{}, err
	}
	size := func(i int) int {
		if i < 0 {
			return 1
		}
		return mesh.Dim(i)
	}
	switch {
	case tokens < 1 || context < 1 || heads < 1 || hidden < 1 || ffn < 1:
		return Transformer{}, fmt.Errorf("layout: transformer: tokens %d, context %d, heads %d, hidden %d, ffn %d: each must be positive", tokens, context, heads, hidden, ffn)
	case tokens%context != 0 || hidden%heads != 0 || heads%size(tp) != 0:
		return Transformer{}, fmt.Errorf("layout: transformer: tokens %d must be a multiple of context %d, hidden %d of heads %d, heads of tp = %d",
			tokens, context, hidden, heads, size(tp))
	case (tokens/context)%size(dp) != 0:
		return Transformer{}, fmt.Errorf("layout: transformer: batch %d (tokens %d / context %d) must be a multiple of dp = %d", tokens/context, tokens, context, size(dp))
	case cp >= 0 && context < 2*size(cp):
		return Transformer{}, fmt.Errorf("layout: transformer: context %d on cp = %d: zigzag ring attention splits a sequence into 2·cp = %d chunks, so it needs %d positions at least",
			context, size(cp), 2*size(cp), 2*size(cp))
	}
	if err := CheckSizes(tokens, hidden, ffn); err != nil {
		return Transformer{}, err
	}
	if pl == nil {
		pl = placement.DefaultPlanner()
	}
	// per lays out a tensor: its placement on dp, on cp and on tp.
	per := func(onDP, onCP, onTP placement.Placement) []placement.Placement {
		ps := make([]placement.Placement, mesh.NDim())
		for i, at := range []int{dp, cp, tp} {
			if at >= 0 {
				ps[at] = []placement.Placement{onDP, onCP, onTP}[i]
			}
		}
		return ps
	}
	row, repl := placement.Shard{Dim: 0}, placement.Replicate{}
	tpRows := placement.Placement(repl)
	up, down := "column", "row"
	if sequenceParallel {
		tpRows, up, down = row, "sequence-column", "sequence-row"
	}
	if tp < 0 {
		// No tensor parallelism: every dim splits tokens.
		up, down = "data-parallel", "data-parallel"
	}
	rows := per(row, row, tpRows)
	spec := func(shape []int, ps []placement.Placement) placement.Spec {
		return placement.MustSpec(shape, mesh, ps...)
	}
	var t Transformer
	plan := func(name, op string, ins []spmd.Operand, out string, want []placement.Placement, ring []string) (placement.Spec, error) {
		req := spmd.Request{Op: op, Inputs: ins, Options: spmd.Options{Output: out, Out: want, Ring: ring}}
		fwd, err := spmd.ForwardWith(ctx, pl, req)
		if err != nil {
			return placement.Spec{}, fmt.Errorf("layout: transformer: %s: %w", name, err)
		}
		bwd, err := spmd.BackwardOfWith(ctx, pl, fwd, nil, nil)
		if err != nil {
			return placement.Spec{}, fmt.Errorf("layout: transformer: %s: %w", name, err)
		}
		t.Ops = append(t.Ops, Op{Name: name, Fwd: fwd, Bwd: bwd})
		return fwd.Final.Spec, nil
	}
	linear := func(name, preset string, x placement.Spec, n int, w, b, y string) (placement.Spec, error) {
		l, err := Preset(preset, mesh, tokens, x.Shape[1], n, true)
		if err != nil {
			return placement.Spec{}, err
		}
		out := l.Out
		switch {
		case out != nil:
		case tp >= 0: // column parallel: y split by columns
			out = per(row, row, placement.Shard{Dim: 1})
		default: // token-wise: y keeps the rows of x
			out = per(row, row, nil)
		}
		return plan(name, "linear", []spmd.Operand{{Name: "x", Spec: l.X}, {Name: w, Spec: l.W}, {Name: b, Spec: *l.B}}, y, out, nil)
	}
	norm := func(name string, x placement.Spec, y string) (placement.Spec, error) {
		r := spec([]int{hidden}, per(repl, repl, repl))
		return plan(name, "layernorm", []spmd.Operand{{Name: "x", Spec: x}, {Name: "gamma", Spec: r}, {Name: "beta", Spec: r}}, y, rows, nil)
	}
	x := spec([]int{tokens, hidden}, rows)
	h1, err := norm("ln1", x, "h1")
	if err != nil {
		return Transformer{}, err
	}
	if _, err := linear("qkv", up, h1, 3*hidden, "w_qkv", "b_qkv", "qkv"); err != nil {
		return Transformer{}, err
	}
	// Attention on the heads of this rank: q, k, v [batch, context, heads,
	// head dim] split by heads over tp, as the column-parallel qkv leaves
	// them, by batch over dp and by context over cp (ring attention allowed).
	qs := spec([]int{tokens / context, context, heads, hidden / heads}, per(row, placement.Shard{Dim: 1}, placement.Shard{Dim: 2}))
	var ring []string
	if cp >= 0 {
		ring = []string{"cp"}
	}
	if _, err := plan("attention", "attention", []spmd.Operand{{Name: "q", Spec: qs}, {Name: "k", Spec: qs}, {Name: "v", Spec: qs}}, "o", qs.Placements, ring); err != nil {
		return Transformer{}, err
	}
	o := spec([]int{tokens, hidden}, per(row, row, placement.Shard{Dim: 1}))
	p, err := linear("proj", down, o, hidden, "w_proj", "b_proj", "a")
	if err != nil {
		return Transformer{}, err
	}
	x2, err := plan("add1", "add", []spmd.Operand{{Name: "x", Spec: x}, {Name: "a", Spec: p}}, "x2", rows, nil)
	if err != nil {
		return Transformer{}, err
	}
	h2, err := norm("ln2", x2, "h2")
	if err != nil {
		return Transformer{}, err
	}
	u, err := linear("up", up, h2, ffn, "w_up", "b_up", "u")
	if err != nil {
		return Transformer{}, err
	}
	g, err := plan("gelu", "gelu", []spmd.Operand{{Name: "u", Spec: u}}, "g", nil, nil)
	if err != nil {
		return Transformer{}, err
	}
	d, err := linear("down", down, g, hidden, "w_down", "b_down", "m")
	if err != nil {
		return Transformer{}, err
	}
	if _, err := plan("add2", "add", []spmd.Operand{{Name: "x2", Spec: x2}, {Name: "m", Spec: d}}, "y", rows, nil); err != nil {
		return Transformer{}, err
	}
	return t, nil
}
