package layout_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/placement"
)

// kinds lists an op's collectives as "fwd|bwd kind tensor dims", a ring's
// transfers as send_recv.
func kinds(op layout.Op) []string {
	var out []string
	for _, c := range op.Fwd.Collectives() {
		out = append(out, fmt.Sprintf("fwd %s %s %v", c.Kind(), c.Tensor, c.Step.MeshDims))
	}
	for _, c := range op.Bwd.Collectives() {
		out = append(out, fmt.Sprintf("bwd %s %s %v", c.Kind(), c.Tensor, c.Step.MeshDims))
	}
	return out
}

// TestTransformerContextParallel: on dims dp, cp and tp the block splits
// the batch over dp and every sequence over cp; at a context of 8192
// attention runs as a ring over cp and nothing else moves over cp or dp
// forward, the parameters' gradients are all-reduced over them backward,
// and tp keeps Megatron's two all-reduces each way.
func TestTransformerContextParallel(t *testing.T) {
	for _, tc := range []struct {
		mesh   string
		tokens int
	}{{"cp=2,tp=2", 8192}, {"cp=2", 8192}, {"dp=2,cp=2,tp=2", 16384}} {
		mesh, err := placement.ParseMesh(tc.mesh)
		if err != nil {
			t.Fatal(err)
		}
		cp, _ := mesh.DimIndex("cp")
		tf, err := layout.NewTransformerWith(context.Background(), nil, mesh, tc.tokens, 8192, 16, 1024, 4096, false)
		if err != nil {
			t.Fatalf("%s: %v", tc.mesh, err)
		}
		if len(tf.Ops) != 10 || tf.Ops[2].Name != "attention" {
			t.Fatalf("%s: ops %v", tc.mesh, tf.Ops)
		}
		for _, op := range tf.Ops {
			ks := kinds(op)
			if op.Name == "attention" {
				if op.Fwd.Ring == nil || op.Fwd.Ring.MeshDim != cp || !op.Fwd.Ring.Zigzag {
					t.Errorf("%s: attention %v", tc.mesh, op.Fwd.Strategy)
				}
				for _, k := range ks {
					if !strings.Contains(k, "send_recv") {
						t.Errorf("%s: attention's %s", tc.mesh, k)
					}
				}
				continue
			}
			for _, k := range ks {
				tp := strings.HasSuffix(k, fmt.Sprintf("[%d]", mesh.NDim()-1)) && strings.Contains(tc.mesh, "tp")
				switch {
				case strings.HasPrefix(k, "fwd") && !tp:
					t.Errorf("%s: %s moves over dp or cp forward: %s", tc.mesh, op.Name, k)
				case strings.HasPrefix(k, "bwd") && !tp && !strings.Contains(k, "all_reduce d"):
					t.Errorf("%s: %s: %s", tc.mesh, op.Name, k)
				}
			}
			// Every parameter's gradient is reduced over cp (with dp, over
			// both at once).
			for _, in := range op.Fwd.Inputs[1:] {
				if op.Name == "add1" || op.Name == "add2" {
					break
				}
				if !slices.ContainsFunc(ks, func(k string) bool {
					dims, ok := strings.CutPrefix(k, "bwd all_reduce d"+in.Name+" [")
					return ok && slices.Contains(strings.Fields(strings.TrimSuffix(dims, "]")), fmt.Sprint(cp))
				}) {
					t.Errorf("%s: %s: d%s is not all-reduced over cp: %v", tc.mesh, op.Name, in.Name, ks)
				}
			}
		}
	}
	for _, bad := range []struct{ mesh, want string }{
		{"tp=2,cp=2", "tp must be the last"}, {"cp=2,ep=2", "named dp, cp and tp"}, {"cp=8", "16 positions at least"}, {"dp=3,cp=2", "multiple of dp"},
	} {
		mesh, _ := placement.ParseMesh(bad.mesh)
		if _, err := layout.NewTransformerWith(context.Background(), nil, mesh, 32, 8, 2, 16, 32, false); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want %q", bad.mesh, err, bad.want)
		}
	}
}
