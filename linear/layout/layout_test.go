package layout_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd/spmdtest"
)

// collectives lists an op's collectives as "fwd kind tensor dims".
func collectives(op layout.Op) []string {
	var out []string
	for _, c := range op.Fwd.Collectives() {
		out = append(out, fmt.Sprintf("fwd %s %s %v", c.Step.Kind, c.Tensor, c.Step.MeshDims))
	}
	for _, c := range op.Bwd.Collectives() {
		out = append(out, fmt.Sprintf("bwd %s %s %v", c.Step.Kind, c.Tensor, c.Step.MeshDims))
	}
	return out
}

// TestMLP pins the Megatron block's layout: W1 and b1 split by ffn over tp, W2
// split by ffn, b2 replicated, h and g split by ffn, tokens over dp; one
// all-reduce each way without sequence parallel, all-gather and reduce-scatter
// with it; weight gradients all-reduced over dp.
func TestMLP(t *testing.T) {
	for _, tc := range []struct {
		mesh string
		sp   bool
		// x w1 b1 h g w2 b2 y
		specs string
		comms map[string][]string // by op
	}{
		{"tp=2", false, "12x8:[R] 24x8:[S(0)] 24:[S(0)] 12x24:[S(1)] 12x24:[S(1)] 8x24:[S(1)] 8:[R] 12x8:[R]",
			map[string][]string{"up": {"bwd all_reduce dx [0]"}, "down": {"fwd all_reduce y [0]"}}},
		{"tp=3", true, "12x8:[S(0)] 24x8:[S(0)] 24:[S(0)] 12x24:[S(1)] 12x24:[S(1)] 8x24:[S(1)] 8:[R] 12x8:[S(0)]",
			map[string][]string{"up": {"fwd all_gather x [0]", "bwd reduce_scatter dx [0]"}, "down": {"fwd reduce_scatter y [0]", "bwd all_gather dy [0]"}}},
		{"dp=2,tp=2", false, "12x8:[S(0),R] 24x8:[R,S(0)] 24:[R,S(0)] 12x24:[S(0),S(1)] 12x24:[S(0),S(1)] 8x24:[R,S(1)] 8:[R,R] 12x8:[S(0),R]",
			map[string][]string{
				"up":   {"bwd all_reduce dx [1]", "bwd all_reduce dw1 [0]", "bwd all_reduce db1 [0]"},
				"down": {"fwd all_reduce y [1]", "bwd all_reduce dw2 [0]", "bwd all_reduce db2 [0 1]"}}},
		{"2x3", true, "12x8:[S(0),S(0)] 24x8:[R,S(0)] 24:[R,S(0)] 12x24:[S(0),S(1)] 12x24:[S(0),S(1)] 8x24:[R,S(1)] 8:[R,R] 12x8:[S(0),S(0)]",
			map[string][]string{
				"up":   {"fwd all_gather x [1]", "bwd reduce_scatter dx [1]", "bwd all_reduce dw1 [0]", "bwd all_reduce db1 [0]"},
				"down": {"fwd reduce_scatter y [1]", "bwd all_gather dy [1]", "bwd all_reduce dw2 [0]", "bwd all_reduce db2 [0 1]"}}},
		{"1", false, "12x8:[R] 24x8:[S(0)] 24:[S(0)] 12x24:[S(1)] 12x24:[S(1)] 8x24:[S(1)] 8:[R] 12x8:[R]", nil}, // one rank: nothing moves
	} {
		t.Run(fmt.Sprintf("%s sp=%v", tc.mesh, tc.sp), func(t *testing.T) {
			m, err := placement.ParseMesh(tc.mesh)
			if err != nil {
				t.Fatal(err)
			}
			// Large-layer proportions: at 12x8x24 the default model would
			// rather compute the whole block on every dp rank than
			// all-reduce its weight gradients.
			l, err := layout.NewMLPWith(context.Background(), placement.NewPlanner(spmdtest.LargeLayers, placement.DefaultBudget), m, 12, 8, 24, tc.sp)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, op := range l.Ops {
				names = append(names, op.Name)
			}
			if strings.Join(names, ",") != "up,gelu,down" {
				t.Fatalf("ops %v", names)
			}
			got := fmt.Sprint(l.Up.X, l.Up.W, *l.Up.B, l.Ops[0].Fwd.Final.Spec, l.Down.X, l.Down.W, *l.Down.B, l.Ops[2].Fwd.Final.Spec)
			if got != tc.specs {
				t.Errorf("x w1 b1 h g w2 b2 y:\ngot  %s\nwant %s", got, tc.specs)
			}
			if !l.Ops[1].Fwd.Inputs[0].Spec.Equal(l.Ops[0].Fwd.Final.Spec) || !l.Ops[1].Fwd.Final.Spec.Equal(l.Down.X) {
				t.Errorf("gelu takes %s and gives %s; up gives %s, down takes %s",
					l.Ops[1].Fwd.Inputs[0].Spec, l.Ops[1].Fwd.Final.Spec, l.Ops[0].Fwd.Final.Spec, l.Down.X)
			}
			for _, op := range l.Ops {
				if got, want := strings.Join(collectives(op), "; "), strings.Join(tc.comms[op.Name], "; "); got != want {
					t.Errorf("%s collectives:\ngot  %s\nwant %s", op.Name, got, want)
				}
			}
		})
	}
}

func TestMLPRefuses(t *testing.T) {
	m := placement.MustMesh([]int{2}, []string{"tp"})
	for _, sizes := range [][3]int{{0, 8, 24}, {12, 0, 24}, {12, 8, -1}} {
		if _, err := layout.NewMLP(m, sizes[0], sizes[1], sizes[2], false); err == nil || !strings.Contains(err.Error(), "must be positive") {
			t.Errorf("sizes %v: %v", sizes, err)
		}
	}
}

// TestPreset pins every preset on dp=2,tp=2: dp shards tokens and replicates
// the parameters, tp as the preset says.
func TestPreset(t *testing.T) {
	m := placement.MustMesh([]int{2, 2}, []string{"dp", "tp"})
	want := map[string]string{
		"replicated":      "x 8x16:[S(0),R] w 32x16:[R,R] b 32:[R,R] out []",
		"column":          "x 8x16:[S(0),R] w 32x16:[R,S(0)] b 32:[R,S(0)] out []",
		"column-gather":   "x 8x16:[S(0),R] w 32x16:[R,S(0)] b 32:[R,S(0)] out [S(0),R]",
		"row":             "x 8x16:[S(0),S(1)] w 32x16:[R,S(1)] b 32:[R,R] out [S(0),R]",
		"data-parallel":   "x 8x16:[S(0),S(0)] w 32x16:[R,R] b 32:[R,R] out []",
		"sequence-column": "x 8x16:[S(0),S(0)] w 32x16:[R,S(0)] b 32:[R,S(0)] out []",
		"sequence-row":    "x 8x16:[S(0),S(1)] w 32x16:[R,S(1)] b 32:[R,R] out [S(0),S(0)]",
	}
	if got := len(layout.Presets()); got != len(want) {
		t.Errorf("%d presets, want %d: %v", got, len(want), layout.Presets())
	}
	for name, w := range want {
		l, err := layout.Preset(name, m, 8, 16, 32, true)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out := "[]"
		if l.Out != nil {
			out = placement.FormatList(l.Out)
		}
		if got := fmt.Sprintf("x %s w %s b %s out %s", l.X, l.W, *l.B, out); got != w {
			t.Errorf("%s:\ngot  %s\nwant %s", name, got, w)
		}
	}
	if l, err := layout.Preset("column", m, 8, 16, 32, false); err != nil || l.B != nil {
		t.Errorf("no bias: %+v %v", l, err)
	}
	if _, err := layout.Preset("diagonal", m, 8, 16, 32, true); !errors.Is(err, layout.ErrUnknown) || !strings.Contains(err.Error(), "column, column-gather") {
		t.Errorf("unknown preset: %v", err)
	}
}

// TestImports: the layout is pure and reachable from the launcher, which must
// not link collective: it imports placement, spmd and tensor only.
func TestImports(t *testing.T) {
	allowed := map[string]bool{deps.Module + "/linear/layout": true, deps.Module + "/placement": true, deps.Module + "/spmd": true, deps.Module + "/tensor": true}
	for _, d := range deps.Of(t, deps.Module+"/linear/layout") {
		if !d.Standard && !allowed[d.ImportPath] {
			t.Errorf("linear/layout depends on %s", d.ImportPath)
		}
	}
}
