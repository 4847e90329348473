package collectivetest

import (
	"context"
	"fmt"
	"math/rand"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/placement/placementref"
	"github.com/meshrun/meshrun/redistribute"
)

// testPlans plans random redistributions on mesh, executes them with
// redistribute.Execute on every rank and compares the locals and the executed
// steps with placement/placementref.
func testPlans(t *testing.T, e *env, mesh placement.Mesh) {
	ws := e.ws
	rng := rand.New(rand.NewSource(int64(mesh.Size())))
	shapes := [][]int{{7, 5}, {5, 6, 3}, {1, 9}, {2, 3}}
	choices := []string{"R", "S(0)", "S(1)", "S(0,chunk)", "P", "P(avg)", "P(max)", "P(min)"}
	ran := 0
	kinds := map[placement.StepKind]int{}
	for try := 0; try < 400 && ran < 40; try++ {
		shape := shapes[rng.Intn(len(shapes))]
		pick := func(allowPartial bool, op string) []placement.Placement {
			ps := make([]placement.Placement, mesh.NDim())
			for i := range ps {
				c := choices[rng.Intn(len(choices))]
				if c[0] == 'P' {
					if !allowPartial {
						c = "R"
					} else if op != "" {
						c = op
					}
				}
				ps[i] = placement.MustParse(c)
			}
			return ps
		}
		op := choices[4+rng.Intn(4)]
		from, err := placement.NewSpec(shape, mesh, pick(true, op)...)
		if err != nil {
			continue
		}
		to, err := placement.NewSpec(shape, mesh, pick(rng.Intn(3) == 0, op)...)
		if err != nil {
			continue
		}
		steps, err := placement.Plan(from, to)
		if err != nil {
			continue
		}
		ran++
		for _, st := range steps {
			kinds[st.Kind]++
		}
		name := fmt.Sprintf("%v_%s_to_%s", shape, placement.FormatList(from.Placements), placement.FormatList(to.Placements))
		global := placementref.New(shape...)
		for i := range global.Data {
			global.Data[i] = float64(rng.Intn(17) - 8)
		}
		locals := placementref.Shard(global, from)
		want, traffic, err := placementref.Run(locals, steps)
		if err != nil {
			t.Fatalf("%s: reference: %v", name, err)
		}
		got := make([][]float64, len(ws))
		logs := make([][]redistribute.Executed, len(ws))
		must(t, RunRanks(ws, func(w *collective.World) error {
			in := put(e, w.Rank(), append([]float64(nil), locals[w.Rank()].Data...))
			out, log, err := redistribute.Execute(context.Background(), w, steps, in, nil)
			if err != nil {
				return err
			}
			if out.Device() != in.Device() {
				return fmt.Errorf("result on %v, input on %v", out.Device(), in.Device())
			}
			got[w.Rank()], logs[w.Rank()] = get[float64](out), log
			return nil
		}))
		for r := range ws {
			if len(got[r]) != len(want[r].Data) {
				t.Fatalf("%s: rank %d holds %d elements, reference %d", name, r, len(got[r]), len(want[r].Data))
			}
			for i := range got[r] {
				if !close64(got[r][i], want[r].Data[i]) {
					t.Fatalf("%s (plan %v): rank %d [%d] = %v, reference %v", name, steps, r, i, got[r][i], want[r].Data[i])
				}
			}
			// The executed steps are the plan's, with the plan's input sizes.
			if len(logs[r]) != len(steps) {
				t.Fatalf("%s: rank %d executed %d steps of %d", name, r, len(logs[r]), len(steps))
			}
			k := 0
			for i, st := range steps {
				ex := logs[r][i]
				if ex.Kind != st.Kind || fmt.Sprint(ex.MeshDims) != fmt.Sprint(st.MeshDims) || ex.InputElems != st.InputElems(r) {
					t.Fatalf("%s: rank %d step %d executed %+v, plan %s input %d", name, r, i, ex, st, st.InputElems(r))
				}
				if st.Kind.Moves() {
					if r == 0 && (traffic[k].Kind != ex.Kind || traffic[k].InputElems != ex.InputElems) {
						t.Fatalf("%s: step %d: reference traffic %+v, executed %+v", name, i, traffic[k], ex)
					}
					k++
				}
			}
		}
	}
	t.Logf("mesh %s: %d plans, steps by kind %v", mesh, ran, kinds)
	if ran < 10 {
		t.Fatalf("only %d plans ran", ran)
	}
}
