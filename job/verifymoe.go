package job

import (
	"context"
	"fmt"
	"math"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/moe"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/placement/placementref"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/spmd/spmdref"
	"github.com/meshrun/meshrun/tensor"
)

// moeCase is one mixture-of-experts layer verify checks: the router, top-k
// and permutation, the dispatch, the grouped linears, the combine and the
// aux loss, forward and every gradient, against the float64 reference.
type moeCase struct {
	plan    *spmd.MoEPlan
	seed    uint64
	command string
}

// moeMeshes lists the meshes of world ranks verify runs the layer on: ep
// over all of them, then every 2-D mesh of ep with tp or dp, then every 3-D
// mesh of dp, ep and tp (each dim at least 2).
func moeMeshes(world int) []placement.Mesh {
	return meshesOf(world, "ep", [][2]string{{"ep", "tp"}, {"dp", "ep"}}, [3]string{"dp", "ep", "tp"})
}

// moeCases are the layers verify runs on mesh: T = 2P+1 tokens (P ranks:
// no split is even), E = ep+1 experts (ep does not divide it) of which the
// last gets no token, k = 2; dropless, and with a capacity factor of 1 that
// drops slots. quick keeps the dropless one.
func moeCases(m placement.Mesh, quick bool) ([]moeCase, error) {
	ep := 1
	if d, err := m.DimIndex("ep"); err == nil {
		ep = m.Dim(d)
	}
	var out []moeCase
	for i, c := range []float64{0, 1} {
		if quick && c > 0 {
			break
		}
		s := spmd.MoEShape{T: 2*m.Size() + 1, H: 8, F: 6, E: max(ep+1, 3), K: 2, Capacity: c}
		p, err := spmd.PlanMoE(m, s, 4)
		if err != nil {
			return nil, err
		}
		out = append(out, moeCase{plan: p, seed: uint64(i + 1), command: fmt.Sprintf("layer T=%d H=%d F=%d E=%d k=%d capacity factor %g, seed %d",
			s.T, s.H, s.F, s.E, s.K, c, i+1)})
	}
	return out, nil
}

// idleLast makes the last expert idle: x's column 0 is 1 and the router's
// weight there -8 for that expert, 0 for the others.
func idleLast(d *moeData) {
	h, e := d.x.Dim(1), d.p.Router.Dim(0)
	for r := range d.x.Dim(0) {
		d.x.Float32()[r*h] = 1
	}
	for j := range e {
		d.p.Router.Float32()[j*h] = 0
	}
	d.p.Router.Float32()[(e-1)*h] = -8
}

// runMoECase runs one layer on this rank; rank 0 compares the gathered
// outputs and gradients with the reference's and reports why it fails.
func runMoECase(ctx context.Context, w *collective.World, k kernels.Compute, c moeCase) (bool, string, error) {
	pl, s := c.plan, c.plan.Shape
	d := randomMoE(s, c.seed)
	idleLast(d)
	const auxCoef = 0.37
	l, err := moe.New(moe.Config{Plan: pl, AuxCoef: auxCoef, DType: tensor.Float32}, w.Rank(), k, d.p)
	if err != nil {
		return false, "", err
	}
	first, n := l.Tokens()
	x, err := uploadRows(k, d.x, first, n)
	if err != nil {
		return false, "", err
	}
	dy, err := uploadRows(k, d.dy, first, n)
	if err != nil {
		return false, "", err
	}
	y, st, err := l.Forward(ctx, w, x)
	if err != nil {
		return false, "", err
	}
	dx, err := l.Backward(ctx, w, dy)
	if err != nil {
		return false, "", err
	}
	type out struct {
		name  string
		spec  placement.Spec
		local *tensor.Tensor
	}
	outs := []out{{"y", pl.X, y}, {"dx", pl.X, dx}, {"drouter", pl.Router, l.DRouter}, {"dw1", pl.W1, l.DW1},
		{"db1", pl.B1, l.DB1}, {"dw2", pl.W2, l.DW2}, {"db2", pl.B2, l.DB2}}
	got := map[string]*tensor.Tensor{}
	for _, o := range outs {
		if got[o.name], err = moe.Gather(ctx, w, o.spec, o.local); err != nil {
			return false, "", err
		}
	}
	planned := l.PlanMatch()
	if w.Rank() != 0 {
		return true, "", nil
	}
	if !planned {
		return false, fmt.Sprintf("collectives %+v, the plan's %+v", l.Executed, pl.Comms), nil
	}
	f64 := func(t *tensor.Tensor) placementref.Tensor {
		r := placementref.New(t.Shape()...)
		for i, v := range t.Float32() {
			r.Data[i] = float64(v)
		}
		return r
	}
	m := spmdref.MoE{K: s.K, Capacity: s.Capacity}
	ps := spmdref.MoEParams{Router: f64(d.p.Router), W1: f64(d.p.W1), B1: f64(d.p.B1), W2: f64(d.p.W2), B2: f64(d.p.B2)}
	ref, err := spmdref.MoEForward(m, f64(d.x), ps)
	if err != nil {
		return false, "", err
	}
	g, err := spmdref.MoEBackward(m, f64(d.x), ps, f64(d.dy), auxCoef)
	if err != nil {
		return false, "", err
	}
	if ref.Tokens[s.E-1] != 0 || fmt.Sprint(st.Tokens) != fmt.Sprint(ref.Tokens) || st.Dropped != ref.Dropped {
		return false, fmt.Sprintf("tokens per expert %v, dropped %d; the reference's %v, %d (its last expert idle)", st.Tokens, st.Dropped, ref.Tokens, ref.Dropped), nil
	}
	if math.Abs(st.Aux-ref.Aux) > 1e-6*math.Abs(ref.Aux) {
		return false, fmt.Sprintf("aux %v, the reference's %v", st.Aux, ref.Aux), nil
	}
	want := map[string]placementref.Tensor{"y": ref.Y, "dx": g.DX, "drouter": g.DRouter, "dw1": g.DW1, "db1": g.DB1, "dw2": g.DW2, "db2": g.DB2}
	for _, o := range outs {
		var diff, big float64
		for i, v := range want[o.name].Data {
			diff = max(diff, math.Abs(float64(got[o.name].Float32()[i])-v))
			big = max(big, math.Abs(v))
		}
		if diff > 1e-5*max(big, 1e-30) {
			return false, fmt.Sprintf("%s: largest difference %.3g, %.3g of its largest value (over 1e-5)", o.name, diff, diff/big), nil
		}
	}
	return true, "", nil
}
