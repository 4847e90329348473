package job

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/placement/placementref"
	"github.com/meshrun/meshrun/redistribute"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/spmd/spmdref"
	"github.com/meshrun/meshrun/tensor"
)

// verifyOps are the ops `worker verify --ops` knows: linear runs through the
// layer (its kernels, its dtype); the others run their spmd plans through real
// collectives with the float64 reference ops as the local ops.
var verifyOps = []string{"linear", "moe", "ring", "matmul", "add", "gelu", "relu", "sum", "layernorm", "softmax", "attention", "embedding", "amax", "sumexp", "pick"}

// opCase is one op, its input layouts and sizes, planned forward and backward.
type opCase struct {
	fwd  *spmd.Plan
	bwd  *spmd.Backward // nil: no gradient has a layout (not the case for P(sum) inputs)
	dims []int
	seed uint64
	// command is the `launcher plan` line that prints the case's plan.
	command string
}

// opShapes are the shape variants of an op at mesh size p (uneven: p+1, p-1,
// primes), with the dims a sum reduces; the first variants are the quick ones.
func opShapes(op string, p int) (shapes [][][]int, dims [][]int) {
	b, k := p+1, max(p-1, 1)
	switch op {
	case "matmul": // a weight broadcast over the batch, batch dims on both, a size-1 batch dim
		return [][][]int{{{b, 3, k}, {k, 5}}, {{b, 3, k}, {b, k, 5}}, {{b, 3, k}, {1, k, 5}}}, [][]int{nil, nil, nil}
	case "add": // broadcast of a vector, of a size-1 row, same shapes
		return [][][]int{{{b, 5}, {5}}, {{b, 5}, {1, 5}}, {{b, 5}, {b, 5}}}, [][]int{nil, nil, nil}
	case "sum":
		return [][][]int{{{b, 3, 5}}, {{b, 3, 5}}, {{b, 3, 5}}}, [][]int{{1}, {0, 2}, nil}
	case "layernorm": // rows of a matrix, of a batch of sequences
		return [][][]int{{{b, 5}, {5}, {5}}, {{2, b, 7}, {7}, {7}}}, [][]int{nil, nil}
	case "softmax": // over the last dim, the first, the middle
		return [][][]int{{{b, 3, 5}}, {{b, 3, 5}}, {{b, 3, 5}}}, [][]int{nil, {0}, {1}}
	case "attention": // batch, sequence, heads, head dim (v's head dim differs)
		return [][][]int{{{2, 3, b, 4}, {2, 3, b, 4}, {2, 3, b, 2}}, {{b, 5, 2, 3}, {b, 5, 2, 3}, {b, 5, 2, 3}}}, [][]int{nil, nil}
	case "amax": // over the last dim, the first two, all
		return [][][]int{{{b, 3, 5}}, {{b, 3, 5}}, {{b, 3, 5}}}, [][]int{{2}, {0, 1}, nil}
	case "sumexp", "pick": // rows of logits over a vocabulary of 2p+1, and a value per row
		return [][][]int{{{b, 2*p + 1}, {b}}, {{2, b, 7}, {2, b}}}, [][]int{nil, nil}
	case "embedding": // ids of a batch of sequences, a table of 2p+1 rows
		return [][][]int{{{b, 3}, {2*p + 1, 4}}, {{b}, {p + 2, k + 1}}}, [][]int{nil, nil}
	}
	return [][][]int{{{b, 5}}, {{2 * p, 7}}}, [][]int{nil, nil}
}

// opCaseLimit bounds the layouts checked per op, mesh and shape variant:
// meshes whose combinations exceed it are sampled (deterministically), smaller
// ones checked exhaustively.
func opCaseLimit(quick bool) int {
	if quick {
		return 48
	}
	return 400
}

// combos returns per^ndim combinations of one choice per mesh dim (indices
// into a list of per choices): all of them when there are at most limit,
// else limit distinct ones drawn with rng.
func combos(per, ndim, limit int, rng *rand.Rand) [][]int {
	total := 1
	for i := 0; i < ndim; i++ {
		total *= per
	}
	pick := func(n int) []int {
		c := make([]int, ndim)
		for i := ndim - 1; i >= 0; i-- {
			c[i], n = n%per, n/per
		}
		return c
	}
	var out [][]int
	if total <= limit {
		for n := 0; n < total; n++ {
			out = append(out, pick(n))
		}
		return out
	}
	for _, n := range rng.Perm(total)[:limit] {
		out = append(out, pick(n))
	}
	return out
}

// opCases enumerates the layouts of op on mesh m: per mesh dim, each input R,
// sharded on any of its dims, P (a pending sum) or P(avg), at the op's shape
// variants.
// Layouts the rules refuse are not cases.
func opCases(ctx context.Context, pl *placement.Planner, op string, m placement.Mesh, quick bool) []opCase {
	shapes, dims := opShapes(op, m.Size())
	if quick {
		shapes, dims = shapes[:1], dims[:1]
	}
	names, _ := spmd.InputNames(op)
	var out []opCase
	for v, ins := range shapes {
		// The choices of one mesh dim: one placement per input.
		var per [][]placement.Placement
		var rec func(prefix []placement.Placement)
		rec = func(prefix []placement.Placement) {
			j := len(prefix)
			if j == len(ins) {
				per = append(per, slices.Clone(prefix))
				return
			}
			opts := []placement.Placement{placement.Replicate{}, placement.Partial{Op: placement.Sum}, placement.Partial{Op: placement.Avg}}
			for d := range ins[j] {
				opts = append(opts, placement.Shard{Dim: d})
			}
			for _, p := range opts {
				rec(append(prefix, p))
			}
		}
		rec(nil)
		rng := rand.New(rand.NewPCG(uint64(len(op)*131+v), uint64(m.Size()*7+m.NDim())))
		for _, c := range combos(len(per), m.NDim(), opCaseLimit(quick), rng) {
			req := spmd.Request{Op: op, Dims: dims[v]}
			ok := true
			for j, sh := range ins {
				ps := make([]placement.Placement, m.NDim())
				for i := range ps {
					ps[i] = per[c[i]][j]
				}
				s, err := placement.NewSpec(sh, m, ps...)
				if err != nil {
					ok = false
					break
				}
				req.Inputs = append(req.Inputs, spmd.Operand{Name: names[j], Spec: s})
			}
			if !ok {
				continue
			}
			fwd, err := spmd.ForwardWith(ctx, pl.WithBudget(placement.DefaultBudget), req)
			if err != nil {
				continue // a layout the rules refuse is not a case
			}
			bwd, err := spmd.BackwardOfWith(ctx, pl.WithBudget(placement.DefaultBudget), fwd, nil, req.Dims)
			if err != nil && !errors.Is(err, spmd.ErrGrad) {
				continue
			}
			cmd := fmt.Sprintf("launcher plan --mesh %s --op %s", m, op)
			for _, in := range req.Inputs {
				cmd += fmt.Sprintf(" --%s '%s'", in.Name, in.Spec)
			}
			if len(req.Dims) > 0 {
				ds := make([]string, len(req.Dims))
				for i, d := range req.Dims {
					ds[i] = fmt.Sprint(d)
				}
				cmd += " --dims " + strings.Join(ds, ",")
			}
			out = append(out, opCase{fwd: fwd, bwd: bwd, dims: req.Dims, seed: uint64(len(out) + 1), command: cmd})
		}
	}
	return out
}

// opTolerance is the largest error, relative to the largest magnitude of the
// reference, that a float64 run may show (summation orders differ).
const opTolerance = 1e-11

// runOpCase runs one case on this rank through real collectives: the inputs
// (drawn alike on every rank from the case's seed) sharded per their layouts,
// every move of the plans, the local ops in float64, and each result gathered
// to every rank and compared with the unsharded reference. The collectives
// executed must be the plans' (kind, mesh dims, elements). Every rank takes
// the same collectives, so a wrong result does not stop the others.
func runOpCase(ctx context.Context, w *collective.World, c opCase) (bool, string, error) {
	rank := w.Rank()
	rng := rand.New(rand.NewPCG(c.seed, 11))
	fwd := c.fwd
	globals := make([]placementref.Tensor, len(fwd.Inputs))
	consumed := make([]*tensor.Tensor, len(fwd.Inputs))
	var why []string
	var log []redistribute.Executed
	move := func(m spmd.Move, t *tensor.Tensor) (*tensor.Tensor, error) {
		out, ex, err := redistribute.Execute(ctx, w, m.Steps, t, nil)
		if err != nil {
			return nil, fmt.Errorf("moving %s %s -> %s: %w", m.Tensor, m.From, m.To, err)
		}
		log = append(log, ex...)
		return out.Reshape(m.To.LocalShape(rank)...)
	}
	for j, in := range fwd.Inputs {
		globals[j] = randomSim(rng, in.Spec.Shape)
		if spmdref.IsIndex(fwd.Op, j) { // ids: rows of the table, or pick's columns
			n := spmdref.IndexBound(fwd.Op, [][]int{fwd.Inputs[0].Spec.Shape, fwd.Inputs[1].Spec.Shape})
			for i := range globals[j].Data {
				globals[j].Data[i] = float64(rng.IntN(n))
			}
		}
		consumed[j] = shardOf(globals[j], in.Spec, rank)
	}
	for j, in := range fwd.Inputs {
		if m, ok := moveNamed(fwd, in.Name); ok {
			var err error
			if consumed[j], err = move(m, consumed[j]); err != nil {
				return false, "", err
			}
		}
	}
	y, err := localOp(fwd, consumed, rank)
	if err != nil {
		return false, "", err
	}
	if m, ok := moveNamed(fwd, fwd.Final.Name); ok {
		if y, err = move(m, y); err != nil {
			return false, "", err
		}
	}
	want, err := spmdref.Eval(fwd.Op, fwd.Equation, globals, fwd.Output.Spec.Shape)
	if err != nil {
		return false, "", err
	}
	if msg, err := gatherCompare(ctx, w, y, fwd.Final.Spec, want); err != nil {
		return false, "", err
	} else if msg != "" {
		why = append(why, fwd.Final.Name+": "+msg)
	}
	if msg := sameCollectives(fwd.Collectives(), log, rank); msg != "" {
		why = append(why, "forward: "+msg)
	}
	if c.bwd != nil {
		log = nil
		dy := randomSim(rng, c.bwd.DY.Spec.Shape)
		// The layouts of dy made so far, shared by the gradients.
		dys := map[string]*tensor.Tensor{c.bwd.DY.Spec.String(): shardOf(dy, c.bwd.DY.Spec, rank)}
		for _, g := range c.bwd.Grads {
			ins := make([]*tensor.Tensor, len(g.Inputs))
			gg := make([]placementref.Tensor, len(g.Inputs))
			for k, in := range g.Inputs {
				if in.Name == c.bwd.DY.Name {
					gg[k] = dy
					local := g.Local[k].Spec.String()
					if t, ok := dys[local]; ok {
						ins[k] = t
						continue
					}
					m, ok := moveNamed(g.Plan, in.Name)
					if ok && dys[m.From.String()] == nil {
						ok = false
					}
					if !ok {
						return false, "", fmt.Errorf("%s uses %s as %s, which nobody made", g.Output.Name, in.Name, local)
					}
					t, err := move(m, dys[m.From.String()])
					if err != nil {
						return false, "", err
					}
					dys[local], ins[k] = t, t
					continue
				}
				j := slices.IndexFunc(fwd.Inputs, func(o spmd.Operand) bool { return o.Name == in.Name })
				gg[k], ins[k] = globals[j], consumed[j]
				if m, ok := moveNamed(g.Plan, in.Name); ok {
					if ins[k], err = move(m, consumed[j]); err != nil {
						return false, "", err
					}
				}
			}
			d, err := localOp(g.Plan, ins, rank)
			if err != nil {
				return false, "", err
			}
			if m, ok := moveNamed(g.Plan, g.Output.Name); ok {
				if d, err = move(m, d); err != nil {
					return false, "", err
				}
			}
			want, err := spmdref.Eval(g.Op, g.Equation, gg, g.Output.Spec.Shape)
			if err != nil {
				return false, "", err
			}
			if msg, err := gatherCompare(ctx, w, d, g.Final.Spec, want); err != nil {
				return false, "", err
			} else if msg != "" {
				why = append(why, g.Output.Name+": "+msg)
			}
			j := slices.IndexFunc(fwd.Inputs, func(o spmd.Operand) bool { return o.Name == g.Input })
			if msg := ownGradient(d, g.Scale, want, g.Final.Spec, fwd.Inputs[j].Spec, rank); msg != "" {
				why = append(why, g.Output.Name+": "+msg)
			}
		}
		if msg := sameCollectives(c.bwd.Collectives(), log, rank); msg != "" {
			why = append(why, "backward: "+msg)
		}
	}
	return len(why) == 0, strings.Join(why, "; "), nil
}

// ownGradient checks that this rank's gradient, scaled by the plan's factor,
// is the gradient of the rank's own local input: the global gradient's shard,
// divided by the ranks a P(avg) input averages over (its local term moves the
// tensor by 1/n of itself).
func ownGradient(d *tensor.Tensor, scale float64, want placementref.Tensor, final, input placement.Spec, rank int) string {
	n := 1
	for i, p := range input.Placements {
		if q, ok := p.(placement.Partial); ok && q.Op == placement.Avg {
			n *= input.Mesh.Dim(i)
		}
	}
	exp := placementref.Shard(want, final)[rank]
	got := d.Float64()
	top := 0.0
	for _, v := range want.Data {
		top = max(top, math.Abs(v))
	}
	for k, v := range exp.Data {
		if diff := math.Abs(got[k]*scale - v/float64(n)); diff > opTolerance*max(top, 1e-300) && diff > 0 {
			return fmt.Sprintf("rank %d's own gradient (scale %g): element %d = %.17g, want %.17g", rank, scale, k, got[k]*scale, v/float64(n))
		}
	}
	return ""
}

// moveNamed is the plan's move of the named tensor, if it has one.
func moveNamed(p *spmd.Plan, name string) (spmd.Move, bool) {
	for _, m := range p.Moves {
		if m.Tensor == name {
			return m, true
		}
	}
	return spmd.Move{}, false
}

// localOp runs a plan's local op on this rank's operands with the float64
// reference.
func localOp(p *spmd.Plan, ins []*tensor.Tensor, rank int) (*tensor.Tensor, error) {
	s := make([]placementref.Tensor, len(ins))
	for i, t := range ins {
		s[i] = placementref.Tensor{Shape: t.Shape(), Data: t.Float64()}
	}
	out, err := spmdref.EvalAt(p.Op, p.Equation, s, p.Output.Spec.LocalShape(rank), p.RowOffset(rank))
	if err != nil {
		return nil, fmt.Errorf("rank %d: %s: %w", rank, p.Op, err)
	}
	if want := p.Output.Spec.LocalShape(rank); !slices.Equal(out.Shape, want) {
		return nil, fmt.Errorf("rank %d: %s gives %v, the plan says %v", rank, p.Op, out.Shape, want)
	}
	return tensor.FromFloat64(out.Data, out.Shape...)
}

// gatherCompare brings a result laid out as spec (no pending partials) to
// every rank, replicated, and compares it with want; it returns what differs.
func gatherCompare(ctx context.Context, w *collective.World, t *tensor.Tensor, spec placement.Spec, want placementref.Tensor) (string, error) {
	ps := make([]placement.Placement, len(spec.Placements))
	for i := range ps {
		ps[i] = placement.Replicate{}
	}
	steps, err := placement.DefaultPlanner().Plan(ctx, spec, spec.WithPlacements(ps...))
	if err != nil {
		return "", err
	}
	got, _, err := redistribute.Execute(ctx, w, steps, t, nil)
	if err != nil {
		return "", fmt.Errorf("gathering %s: %w", spec, err)
	}
	g := got.Float64()
	scale := 0.0
	for _, v := range want.Data {
		scale = max(scale, math.Abs(v))
	}
	if len(g) != len(want.Data) {
		return fmt.Sprintf("%d elements, want %d", len(g), len(want.Data)), nil
	}
	for i, v := range g {
		if d := math.Abs(v - want.Data[i]); d > opTolerance*max(scale, 1e-300) && d > 0 {
			return fmt.Sprintf("element %d = %.17g, want %.17g", i, v, want.Data[i]), nil
		}
	}
	return "", nil
}

// sameCollectives compares the collectives a plan promised with those run.
func sameCollectives(plan []spmd.Collective, log []redistribute.Executed, rank int) string {
	var ran []redistribute.Executed
	for _, ex := range log {
		if ex.Kind.Moves() && len(ex.Group) > 1 {
			ran = append(ran, ex)
		}
	}
	if len(ran) != len(plan) {
		return fmt.Sprintf("the plan lists %d collectives, %d ran", len(plan), len(ran))
	}
	for i, c := range plan {
		if ex := ran[i]; ex.Kind != c.Step.Kind || !slices.Equal(ex.MeshDims, c.Step.MeshDims) || ex.InputElems != c.Step.InputElems(rank) {
			return fmt.Sprintf("collective %d: the plan says %s of %d elements on rank %d, ran %s on %v of %d",
				i+1, c.Step, c.Step.InputElems(rank), rank, ex.Kind, ex.MeshDims, ex.InputElems)
		}
	}
	return ""
}

func randomSim(rng *rand.Rand, shape []int) placementref.Tensor {
	t := placementref.New(shape...)
	for i := range t.Data {
		t.Data[i] = rng.Float64()*2 - 1
	}
	return t
}

// shardOf is rank's local tensor of global laid out per spec.
func shardOf(global placementref.Tensor, spec placement.Spec, rank int) *tensor.Tensor {
	l := placementref.Shard(global, spec)[rank]
	t, _ := tensor.FromFloat64(l.Data, l.Shape...) // the shape is the data's
	return t
}
