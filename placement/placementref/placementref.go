// Package placementref is the reference model of placement plans: it moves
// every element by hand. It shards a global float64 tensor per a spec on
// simulated ranks in one process, executes redistribution steps element by
// element as a reference collective would, and assembles the ranks' shards
// back into the global tensor. The tests of placement, spmd, redistribute and
// linear, and job's verify workload, check against it; nothing runs it for
// production work.
package placementref

import (
	"fmt"
	"slices"

	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// Tensor is a dense row-major float64 tensor.
type Tensor struct {
	Shape []int
	Data  []float64
}

// New returns a zero tensor of the given shape.
func New(shape ...int) Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return Tensor{Shape: append([]int(nil), shape...), Data: make([]float64, n)}
}

// Shard returns every rank's local tensor for global laid out per spec. Partial
// mesh dims hold the value on the rank at coordinate 0 and the reduction's
// identity-free equivalent elsewhere: zeros for sum, copies for avg, max and min
// (so each partial op reduces back to global exactly).
func Shard(global Tensor, spec placement.Spec) []Tensor {
	locals := make([]Tensor, spec.Mesh.Size())
	whole := tensor.Whole(global.Shape)
	for r := range locals {
		box := spec.LocalBox(r)
		t := New(box.Shape...)
		tensor.CopyBox(t.Data, box, global.Data, whole)
		coords := spec.Mesh.Coords(r)
		for i, p := range spec.Placements {
			if q, ok := p.(placement.Partial); ok && q.Op == placement.Sum && coords[i] != 0 {
				clear(t.Data)
			}
		}
		locals[r] = t
	}
	return locals
}

// Assemble rebuilds the global tensor from the ranks' locals per spec, applying
// pending partial reductions. It checks that replicas agree: a replicated
// element that differs between ranks is an error.
func Assemble(locals []Tensor, spec placement.Spec) (Tensor, error) {
	global := New(spec.Shape...)
	whole := tensor.Whole(spec.Shape)
	filled := make([]bool, len(global.Data))
	var pdims []int
	for i, p := range spec.Placements {
		if _, ok := p.(placement.Partial); ok {
			pdims = append(pdims, i)
		}
	}
	op, _ := spec.PartialOp()
	for r := range locals {
		coords := spec.Mesh.Coords(r)
		// One representative per partial group: coordinate 0 on every partial dim.
		rep := true
		for _, i := range pdims {
			if coords[i] != 0 {
				rep = false
			}
		}
		if !rep {
			continue
		}
		group := spec.Mesh.Group(r, pdims...)
		box := spec.LocalBox(r)
		var err error
		box.Each(func(g []int) {
			if err != nil {
				return
			}
			k := box.Index(g)
			v := locals[group[0]].Data[k]
			for _, m := range group[1:] {
				v = reduce(op, v, locals[m].Data[k])
			}
			if op == placement.Avg && len(group) > 1 {
				v /= float64(len(group))
			}
			gk := whole.Index(g)
			if filled[gk] && global.Data[gk] != v {
				err = fmt.Errorf("placementref: replicas disagree at %v: %g vs %g", g, global.Data[gk], v)
			}
			global.Data[gk], filled[gk] = v, true
		})
		if err != nil {
			return Tensor{}, err
		}
	}
	for k, ok := range filled {
		if !ok {
			return Tensor{}, fmt.Errorf("placementref: element %d of %s held by no rank", k, spec)
		}
	}
	return global, nil
}

func reduce(op placement.ReduceOp, a, b float64) float64 {
	switch op {
	case placement.Max:
		return max(a, b)
	case placement.Min:
		return min(a, b)
	default: // Sum and Avg accumulate; Avg divides at the end.
		return a + b
	}
}

// Traffic records what a step moved: its kind, the mesh dims of its group and the
// elements rank 0 passed in.
type Traffic struct {
	Kind       placement.StepKind
	MeshDims   []int
	InputElems int64
}

// Run executes steps on the ranks' locals as a reference collective would and
// returns the new locals and one Traffic per step that moves bytes.
func Run(locals []Tensor, steps []placement.Step) ([]Tensor, []Traffic, error) {
	var log []Traffic
	for _, st := range steps {
		next, err := Step(locals, st)
		if err != nil {
			return nil, nil, err
		}
		if st.Moves() {
			log = append(log, Traffic{Kind: st.Kind, MeshDims: st.MeshDims, InputElems: int64(len(locals[0].Data))})
		}
		locals = next
	}
	return locals, log, nil
}

// Step executes one step.
func Step(locals []Tensor, st placement.Step) ([]Tensor, error) {
	mesh := st.From.Mesh
	if len(locals) != mesh.Size() {
		return nil, fmt.Errorf("placementref: %d locals for mesh %s", len(locals), mesh)
	}
	out := make([]Tensor, len(locals))
	for r := range locals {
		if want := st.From.LocalShape(r); !slices.Equal(locals[r].Shape, want) {
			return nil, fmt.Errorf("placementref: rank %d holds %v before %s, want %v", r, locals[r].Shape, st, want)
		}
	}
	for r := range locals {
		box := st.To.LocalBox(r)
		t := New(box.Shape...)
		group := mesh.Group(r, st.MeshDims...)
		var err error
		box.Each(func(g []int) {
			if err != nil {
				return
			}
			k := box.Index(g)
			switch st.Kind {
			case placement.LocalSlice:
				t.Data[k], err = fetch(locals, st.From, r, g)
			case placement.OwnerPartial:
				t.Data[k], err = fetch(locals, st.From, r, g)
				if st.Op == placement.Sum && mesh.Coords(r)[st.MeshDims[0]] != 0 {
					t.Data[k] = 0
				}
			case placement.AllGather, placement.AllToAll:
				found := false
				for _, m := range group {
					if v, e := fetch(locals, st.From, m, g); e == nil {
						t.Data[k], found = v, true
						break
					}
				}
				if !found {
					err = fmt.Errorf("placementref: %s: no rank of group %v holds %v", st, group, g)
				}
			case placement.AllReduce, placement.ReduceScatter:
				var v float64
				for j, m := range group {
					x, e := fetch(locals, st.From, m, g)
					if e != nil {
						err = e
						return
					}
					if j == 0 {
						v = x
					} else {
						v = reduce(st.Op, v, x)
					}
				}
				if st.Op == placement.Avg {
					v /= float64(len(group))
				}
				t.Data[k] = v
			}
		})
		if err != nil {
			return nil, err
		}
		out[r] = t
	}
	return out, nil
}

func fetch(locals []Tensor, spec placement.Spec, rank int, g []int) (float64, error) {
	box := spec.LocalBox(rank)
	if !box.Contains(g) {
		return 0, fmt.Errorf("placementref: rank %d does not hold %v under %s", rank, g, spec)
	}
	return locals[rank].Data[box.Index(g)], nil
}
