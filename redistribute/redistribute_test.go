package redistribute_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/placement/placementref"
	"github.com/meshrun/meshrun/redistribute"
	"github.com/meshrun/meshrun/tensor"
)

func localWorlds(t testing.TB, n int) []*collective.World {
	ts := collective.LocalTransports(n)
	cs := collective.LocalControls(n)
	ws := make([]*collective.World, n)
	for i := range ws {
		w, err := collective.NewWorld(ts[i], cs[i], collective.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ws[i] = w
		t.Cleanup(func() { w.Close() })
	}
	return ws
}

func must(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// TestExecuteBoxes runs every plan between the placements of a 3-D tensor on
// a 2x2 mesh (sharding any dim, so that boxes are packed along inner dims as
// well as taken as they are) and compares each rank's result with
// placementref's.
func TestExecuteBoxes(t *testing.T) {
	mesh, err := placement.ParseMesh("a=2,b=2")
	if err != nil {
		t.Fatal(err)
	}
	ws := localWorlds(t, mesh.Size())
	shape := []int{3, 5, 4}
	global := placementref.New(shape...)
	for i := range global.Data {
		global.Data[i] = float64(i%23 - 11)
	}
	choices := []string{"R", "S(0)", "S(1)", "S(2)", "S(1,chunk)", "P"}
	ran := 0
	for _, a := range choices {
		for _, b := range choices {
			from, err := placement.NewSpec(shape, mesh, placement.MustParse(a), placement.MustParse(b))
			if err != nil {
				continue
			}
			for _, c := range choices[:5] {
				for _, d := range choices[:5] {
					to, err := placement.NewSpec(shape, mesh, placement.MustParse(c), placement.MustParse(d))
					if err != nil {
						continue
					}
					steps, err := placement.Plan(from, to)
					if err != nil {
						continue
					}
					ran++
					checkPlan(t, ws, global, from, to, steps)
				}
			}
		}
	}
	if ran < 100 {
		t.Fatalf("only %d plans ran", ran)
	}
}

func checkPlan(t *testing.T, ws []*collective.World, global placementref.Tensor, from, to placement.Spec, steps []placement.Step) {
	t.Helper()
	name := fmt.Sprintf("%s to %s", placement.FormatList(from.Placements), placement.FormatList(to.Placements))
	locals := placementref.Shard(global, from)
	want, _, err := placementref.Run(locals, steps)
	if err != nil {
		t.Fatalf("%s: reference: %v", name, err)
	}
	got := make([][]float64, len(ws))
	must(t, collectivetest.RunRanks(ws, func(w *collective.World) error {
		in, err := tensor.FromFloat64(slices.Clone(locals[w.Rank()].Data), locals[w.Rank()].Shape...)
		if err != nil {
			return err
		}
		out, log, err := redistribute.Execute(context.Background(), w, steps, in, nil)
		if err != nil {
			return err
		}
		if len(log) != len(steps) {
			return fmt.Errorf("%d steps executed of %d", len(log), len(steps))
		}
		got[w.Rank()] = out.Float64()
		return nil
	}))
	for r := range ws {
		if !slices.Equal(got[r], want[r].Data) {
			t.Fatalf("%s (plan %v): rank %d holds %v, reference %v", name, steps, r, got[r], want[r].Data)
		}
	}
}

func TestMeshGroup(t *testing.T) {
	mesh, err := placement.ParseMesh("a=2,b=3")
	if err != nil {
		t.Fatal(err)
	}
	ws := localWorlds(t, mesh.Size())
	groups := make([][]int, len(ws))
	must(t, collectivetest.RunRanks(ws, func(w *collective.World) error {
		g, err := redistribute.MeshGroup(context.Background(), w, mesh, 1)
		if err != nil {
			return err
		}
		groups[w.Rank()] = g.Ranks()
		return nil
	}))
	for r, g := range groups {
		if want := mesh.Group(r, 1); !slices.Equal(g, want) {
			t.Errorf("rank %d: group %v, want %v", r, g, want)
		}
	}
	small, _ := placement.ParseMesh("a=2")
	for _, c := range []struct {
		mesh placement.Mesh
		dims []int
	}{{mesh, []int{2}}, {mesh, []int{-1}}, {small, []int{0}}} {
		if _, err := redistribute.MeshGroup(context.Background(), ws[0], c.mesh, c.dims...); !errors.Is(err, collective.ErrInvalid) {
			t.Errorf("MeshGroup(%s, %v): %v, want ErrInvalid", c.mesh, c.dims, err)
		}
	}
}
