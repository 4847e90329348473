package spmd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/meshrun/meshrun/placement"
	sim "github.com/meshrun/meshrun/placement/placementref"
	"github.com/meshrun/meshrun/spmd/spmdref"
)

func randomTensor(rng *rand.Rand, shape []int) sim.Tensor {
	t := sim.New(shape...)
	for i := range t.Data {
		t.Data[i] = rng.Float64()*2 - 1
	}
	return t
}

// randomInput draws input j of fwd: uniform in [-1, 1), or ids in range for
// an embedding (a few past the table's rows, which look up zeros, are not
// valid input: PyTorch refuses them).
func randomInput(rng *rand.Rand, fwd *Plan, j int) sim.Tensor {
	in := fwd.Inputs[j]
	if !spmdref.IsIndex(fwd.Op, j) {
		return randomTensor(rng, in.Spec.Shape)
	}
	n := spmdref.IndexBound(fwd.Op, [][]int{fwd.Inputs[0].Spec.Shape, fwd.Inputs[1].Spec.Shape})
	t := sim.New(in.Spec.Shape...)
	for i := range t.Data {
		t.Data[i] = float64(rng.IntN(n))
	}
	return t
}

// runPlan executes a plan on simulated ranks: moves the inputs (given as the
// ranks' locals), runs the local op on every rank, moves the output. It returns
// the ranks' final locals, the locals the local op consumed, and checks that the
// collectives executed are the plan's.
// held maps "name layout" to locals a caller already holds (dy gathered once for
// several gradients); runPlan adds every layout it moves an input to.
func runPlan(p *Plan, locals [][]sim.Tensor, held map[string][]sim.Tensor) (final []sim.Tensor, consumed [][]sim.Tensor, err error) {
	consumed = make([][]sim.Tensor, len(locals))
	copy(consumed, locals)
	for j, in := range p.Inputs {
		if l := p.Local[j].Spec; !l.Equal(in.Spec) && !slices.ContainsFunc(p.Moves, func(m Move) bool { return m.Tensor == in.Name }) {
			h, ok := held[in.Name+" "+l.String()]
			if !ok {
				return nil, nil, fmt.Errorf("plan uses %s as %s without moving it and nobody holds it", in.Name, l)
			}
			consumed[j] = h
		}
	}
	var traffic []sim.Traffic
	var outMove *Move
	for _, m := range p.Moves {
		j := slices.IndexFunc(p.Inputs, func(o Operand) bool { return o.Name == m.Tensor })
		if j < 0 {
			mm := m
			outMove = &mm
			continue
		}
		next, tr, err := sim.Run(consumed[j], m.Steps)
		if err != nil {
			return nil, nil, fmt.Errorf("moving %s: %w", m.Tensor, err)
		}
		consumed[j], traffic = next, append(traffic, tr...)
		if held != nil {
			held[m.Tensor+" "+m.To.String()] = next
		}
	}
	mesh := p.Inputs[0].Spec.Mesh
	outs := make([]sim.Tensor, mesh.Size())
	for r := range outs {
		ins := make([]sim.Tensor, len(consumed))
		for j := range consumed {
			ins[j] = consumed[j][r]
		}
		o, err := spmdref.EvalAt(p.Op, p.Equation, ins, p.Output.Spec.LocalShape(r), p.RowOffset(r))
		if err != nil {
			return nil, nil, fmt.Errorf("rank %d: %w", r, err)
		}
		if want := p.Output.Spec.LocalShape(r); !slices.Equal(o.Shape, want) {
			return nil, nil, fmt.Errorf("rank %d: local op gives %v, plan says %v", r, o.Shape, want)
		}
		outs[r] = o
	}
	if outMove != nil {
		next, tr, err := sim.Run(outs, outMove.Steps)
		if err != nil {
			return nil, nil, fmt.Errorf("moving output: %w", err)
		}
		outs, traffic = next, append(traffic, tr...)
	}
	cs := p.Collectives()
	if len(cs) != len(traffic) {
		return nil, nil, fmt.Errorf("plan lists %d collectives, %d ran", len(cs), len(traffic))
	}
	for i, c := range cs {
		t := traffic[i]
		if t.Kind != c.Step.Kind || !slices.Equal(t.MeshDims, c.Step.MeshDims) || t.InputElems != c.Elems() {
			return nil, nil, fmt.Errorf("collective %d: plan %s %v %d elems, ran %s %v %d", i, c.Step.Kind, c.Step.MeshDims, c.Elems(), t.Kind, t.MeshDims, t.InputElems)
		}
	}
	return outs, consumed, nil
}

func compare(got, want sim.Tensor, tol float64) error {
	if !slices.Equal(got.Shape, want.Shape) {
		return fmt.Errorf("shape %v, want %v", got.Shape, want.Shape)
	}
	scale := 0.0
	for _, v := range want.Data {
		scale = max(scale, math.Abs(v))
	}
	for i := range got.Data {
		if d := math.Abs(got.Data[i] - want.Data[i]); d > tol*max(scale, 1e-300) && d > 0 {
			return fmt.Errorf("element %d = %.17g, want %.17g (relative error %.3g)", i, got.Data[i], want.Data[i], d/max(scale, 1e-300))
		}
	}
	return nil
}

// checkNumerically runs a forward plan and its backward on simulated ranks with
// random float64 inputs and compares every result with the unsharded reference.
func checkNumerically(rng *rand.Rand, fwd *Plan, bwd *Backward) error {
	globals := make([]sim.Tensor, len(fwd.Inputs))
	locals := make([][]sim.Tensor, len(fwd.Inputs))
	for j, in := range fwd.Inputs {
		globals[j] = randomInput(rng, fwd, j)
		locals[j] = sim.Shard(globals[j], in.Spec)
	}
	outs, consumed, err := runPlan(fwd, locals, nil)
	if err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	got, err := sim.Assemble(outs, fwd.Final.Spec)
	if err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	want, err := spmdref.Eval(fwd.Op, fwd.Equation, globals, fwd.Output.Spec.Shape)
	if err != nil {
		return err
	}
	if err := compare(got, want, 1e-12); err != nil {
		return fmt.Errorf("forward %s: %w", fwd.Final.Name, err)
	}
	if bwd == nil {
		return nil
	}
	dy := randomTensor(rng, bwd.DY.Spec.Shape)
	dyLocals := sim.Shard(dy, bwd.DY.Spec)
	held := map[string][]sim.Tensor{}
	for _, g := range bwd.Grads {
		gl := make([][]sim.Tensor, len(g.Inputs))
		gg := make([]sim.Tensor, len(g.Inputs))
		for k, in := range g.Inputs {
			if in.Name == bwd.DY.Name {
				gl[k], gg[k] = dyLocals, dy
				continue
			}
			j := slices.IndexFunc(fwd.Inputs, func(o Operand) bool { return o.Name == in.Name })
			gl[k], gg[k] = consumed[j], globals[j]
		}
		outs, _, err := runPlan(g.Plan, gl, held)
		if err != nil {
			return fmt.Errorf("backward %s: %w", g.Output.Name, err)
		}
		got, err := sim.Assemble(outs, g.Final.Spec)
		if err != nil {
			return fmt.Errorf("backward %s: %w", g.Output.Name, err)
		}
		want, err := spmdref.Eval(g.Op, g.Equation, gg, g.Output.Spec.Shape)
		if err != nil {
			return err
		}
		if err := compare(got, want, 1e-12); err != nil {
			return fmt.Errorf("backward %s: %w", g.Output.Name, err)
		}
		// Each rank's gradient of its own local input: the loss is Σ_r <dy_r, y_r>
		// over the ranks' local outputs, so the global output's gradient is dy
		// times the ranks an avg output averages over, and a P(avg) input's term
		// t_r moves its tensor by 1/n of itself.
		j := slices.IndexFunc(fwd.Inputs, func(o Operand) bool { return o.Name == g.Input })
		factor := float64(avgRanks(fwd.Final.Spec)) / float64(avgRanks(fwd.Inputs[j].Spec))
		wantLocal := sim.Shard(want, g.Final.Spec)
		for r := range outs {
			scaled := sim.New(outs[r].Shape...)
			exp := sim.New(wantLocal[r].Shape...)
			for k := range scaled.Data {
				scaled.Data[k] = outs[r].Data[k] * g.Scale
				exp.Data[k] = wantLocal[r].Data[k] * factor
			}
			if err := compare(scaled, exp, 1e-12); err != nil {
				return fmt.Errorf("backward %s, rank %d's own gradient (scale %g): %w", g.Output.Name, r, g.Scale, err)
			}
		}
	}
	return nil
}

// avgRanks is the number of ranks a spec's P(avg) mesh dims average over (1
// when none).
func avgRanks(s placement.Spec) int {
	n := 1
	for i, p := range s.Placements {
		if q, ok := p.(placement.Partial); ok && q.Op == placement.Avg {
			n *= s.Mesh.Dim(i)
		}
	}
	return n
}
