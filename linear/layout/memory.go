package layout

import (
	"fmt"

	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// Memory estimates the bytes one rank of the MLP block holds, from its planned
// layout: every tensor the plans name, once per layout a rank keeps it in
// (package linear keeps one buffer per tensor and layout from step to step),
// at its shard's size on rank 0, which holds the largest shards.
type Memory struct {
	// Params: W1, b1, W2, b2 in float32 (the master copy SGD updates), and
	// their copies in the compute dtype.
	Params int64
	// Grads: the weight and bias gradients, accumulated in float32, in every
	// layout they pass through, and their copies in the wire dtype.
	Grads int64
	// Activations: the batch x and the target, h, g, y and their gradients,
	// in the compute dtype, in every layout the plans move them to.
	Activations int64
	// Scratch: the whole parameters, batch and target each rank draws from the
	// seed in float32 before it keeps its shards, and the parameters' copies
	// in the other layouts a forward moves them to.
	Scratch int64
}

// Total is the sum of the parts, saturating at math.MaxInt64.
func (m Memory) Total() int64 {
	t := int64(0)
	for _, n := range []int64{m.Params, m.Grads, m.Activations, m.Scratch} {
		t = placement.SatAdd(t, n)
	}
	return t
}

// String reads "13.1 GiB (params 6.4 GiB, gradients 6.4 GiB, activations
// 305.2 MiB, scratch 0 B)".
func (m Memory) String() string { return FormatBytes(m.Total()) + " (" + m.Parts() + ")" }

// Parts reads "params 6.4 GiB, gradients 6.4 GiB, activations 305.2 MiB,
// scratch 0 B".
func (m Memory) Parts() string {
	return fmt.Sprintf("params %s, gradients %s, activations %s, scratch %s",
		FormatBytes(m.Params), FormatBytes(m.Grads), FormatBytes(m.Activations), FormatBytes(m.Scratch))
}

// FormatBytes renders n bytes for a person: "512 B", "3.0 KiB", "13.1 GiB".
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n), 0
	for f >= unit && i < 6 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", f, "KMGTPE"[i-1])
}

// Memory estimates one rank's memory for the block computed in dtype compute
// (float32 or bfloat16) with weight gradients reduced in grad (0: compute).
func (l MLP) Memory(compute, grad tensor.DType) Memory {
	if grad == 0 {
		grad = compute
	}
	params := map[string]bool{"w1": true, "b1": true, "w2": true, "b2": true}
	given := map[string]placement.Spec{"w1": l.Up.W, "b1": *l.Up.B, "w2": l.Down.W, "b2": *l.Down.B}
	var m Memory
	seen := map[string]bool{}
	add := func(name string, s placement.Spec) {
		key := name + " " + placement.FormatList(s.Placements)
		if seen[key] {
			return
		}
		seen[key] = true
		n := s.LocalElems(0)
		switch {
		case params[name]:
			if s.Equal(given[name]) {
				m.Params = placement.SatAdd(m.Params, placement.SatMul(n, 4))
				if compute != tensor.Float32 {
					m.Params = placement.SatAdd(m.Params, placement.SatMul(n, int64(compute.Size())))
				}
			} else {
				m.Scratch = placement.SatAdd(m.Scratch, placement.SatMul(n, int64(compute.Size())))
			}
		case len(name) > 1 && name[0] == 'd' && params[name[1:]]:
			m.Grads = placement.SatAdd(m.Grads, placement.SatMul(n, 4))
			if grad != tensor.Float32 {
				m.Grads = placement.SatAdd(m.Grads, placement.SatMul(n, int64(grad.Size())))
			}
		default:
			m.Activations = placement.SatAdd(m.Activations, placement.SatMul(n, int64(compute.Size())))
		}
	}
	plan := func(p *spmd.Plan) {
		for i, in := range p.Inputs {
			add(in.Name, in.Spec)
			add(in.Name, p.Local[i].Spec)
		}
		add(p.Output.Name, p.Output.Spec)
		add(p.Final.Name, p.Final.Spec)
		for _, mv := range p.Moves {
			for _, st := range mv.Steps {
				add(mv.Tensor, st.To)
			}
		}
	}
	for _, op := range l.Ops {
		plan(op.Fwd)
		add(op.Bwd.DY.Name, op.Bwd.DY.Spec)
		for _, g := range op.Bwd.Grads {
			plan(g.Plan)
		}
	}
	// The target y is compared with, laid out as y.
	add("target", l.Ops[len(l.Ops)-1].Fwd.Final.Spec)
	// Drawn whole on every rank, then sharded.
	for _, s := range []placement.Spec{l.Up.X, l.Up.W, *l.Up.B, l.Down.W, *l.Down.B, l.Ops[len(l.Ops)-1].Fwd.Final.Spec} {
		m.Scratch = placement.SatAdd(m.Scratch, placement.SatMul(s.NumElems(), 4))
	}
	return m
}
