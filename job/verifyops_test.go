package job

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/redistribute"
)

// TestVerifyOps3D: verify checks the ops beyond linear on every mesh of 8
// ranks, the 3-D one included, and every case passes.
func TestVerifyOps3D(t *testing.T) {
	code, out, errs := run(t, "verify", "--world", "8", "--quick", "--ops", "relu,layernorm,attention,embedding,softmax")
	if code != 0 || strings.Contains(out, "FAIL") {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	for _, op := range []string{"relu", "layernorm", "attention", "embedding", "softmax"} {
		for _, mesh := range []string{"dp=2,cp=2,tp=2", "dp=4,tp=2", "dp=2,tp=4", "tp=8"} {
			if row := fmt.Sprintf("%-10s %-16s", op, mesh); !strings.Contains(out, row) {
				t.Errorf("no row %q in\n%s", row, out)
			}
		}
	}
}

// TestVerifyOpsCatchesWrongPlans: a plan that skips the all-reduce of a
// partial sum fails its case on every rank.
func TestVerifyOpsCatchesWrongPlans(t *testing.T) {
	m := placement.MustMesh([]int{2}, []string{"tp"})
	var c *opCase
	for _, oc := range opCases(context.Background(), nil, "sum", m, false) {
		if strings.Contains(oc.command, "--x '3x3x5:[S(1)]' --dims 1") {
			c = &oc
			break
		}
	}
	if c == nil || len(c.fwd.Moves) != 1 {
		t.Fatalf("no case of sum over a sharded dim (%v)", c)
	}
	c.fwd.Moves = nil
	whys := make([]string, 2)
	err := InProcess(context.Background(), 2, func(ctx context.Context, w *collective.World) error {
		ok, why, err := runOpCase(ctx, w, *c)
		if ok {
			why = "passed"
		}
		whys[w.Rank()] = why
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for r, why := range whys {
		if !strings.HasPrefix(why, "y: element") {
			t.Errorf("rank %d: %q, want a wrong y", r, why)
		}
	}
}

// TestSameCollectives: a collective the plan lists but no rank ran, or one of
// another kind, is reported.
func TestSameCollectives(t *testing.T) {
	m := placement.MustMesh([]int{2}, []string{"tp"})
	var c *opCase
	for _, oc := range opCases(context.Background(), nil, "sum", m, false) {
		if len(oc.fwd.Collectives()) == 1 {
			c = &oc
			break
		}
	}
	if c == nil {
		t.Fatal("no sum case with one collective")
	}
	st := c.fwd.Collectives()[0].Step
	ran := redistribute.Executed{Kind: st.Kind, MeshDims: st.MeshDims, Group: []int{0, 1}, InputElems: st.InputElems(0)}
	if msg := sameCollectives(c.fwd.Collectives(), []redistribute.Executed{ran}, 0); msg != "" {
		t.Fatalf("the plan's own collective: %s", msg)
	}
	if msg := sameCollectives(c.fwd.Collectives(), nil, 0); !strings.Contains(msg, "lists 1 collectives, 0 ran") {
		t.Errorf("none ran: %q", msg)
	}
	ran.Kind = placement.AllToAll
	if msg := sameCollectives(c.fwd.Collectives(), []redistribute.Executed{ran}, 0); !strings.Contains(msg, "ran all_to_all") {
		t.Errorf("another kind ran: %q", msg)
	}
}
