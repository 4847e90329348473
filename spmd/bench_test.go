package spmd

import (
	"testing"

	"github.com/meshrun/meshrun/placement"
)

// BenchmarkLinear3DMesh plans a linear layer with 3-D activations on a 2x2x2 mesh,
// forward and backward: the largest search the rules run in practice.
func BenchmarkLinear3DMesh(b *testing.B) {
	m := placement.MustMesh([]int{2, 2, 2}, []string{"a", "b", "c"})
	spec := func(s string) placement.Spec {
		sp, err := placement.ParseSpec(s, m)
		if err != nil {
			b.Fatal(err)
		}
		return sp
	}
	req := Request{Op: "linear", Inputs: []Operand{
		{Name: "x", Spec: spec("16x8x32:[S(0),S(1),R]")},
		{Name: "w", Spec: spec("64x32:[R,R,S(0)]")},
		{Name: "b", Spec: spec("64:[R,R,S(0)]")},
	}}
	for b.Loop() {
		fwd, err := Forward(req)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := BackwardOf(fwd, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
}
