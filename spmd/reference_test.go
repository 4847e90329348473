package spmd

import (
	"math"
	"testing"

	"github.com/meshrun/meshrun/kernels/kerneltest"
	sim "github.com/meshrun/meshrun/placement/placementref"
	"github.com/meshrun/meshrun/spmd/spmdref"
)

// TestReferencesMatchPyTorch: spmdtest's float64 references, which every
// rule's numerical check and the worker's verify compare with, against
// PyTorch's values (kerneltest.Torch(), PyTorch in float64 with autograd):
// gelu and its derivative, layer norm (its epsilon included: one row's
// variance is below it) and attention, forward and every gradient. Without
// this, a wrong formula there would be checked only against shards of
// itself.
func TestReferencesMatchPyTorch(t *testing.T) {
	ref := kerneltest.Torch()
	check := func(what string, got, want []float64, tol float64) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d values, PyTorch %d", what, len(got), len(want))
		}
		worst := 0.0
		for i := range got {
			e := math.Abs(got[i]-want[i]) / max(1, math.Abs(want[i]))
			if !(e <= tol) {
				t.Fatalf("%s[%d] = %.17g, PyTorch %.17g", what, i, got[i], want[i])
			}
			worst = max(worst, e)
		}
		t.Logf("%s: within %.2g of PyTorch", what, worst)
	}
	eval := func(op, eq string, ins ...sim.Tensor) []float64 {
		t.Helper()
		out, err := spmdref.Eval(op, eq, ins, nil)
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		return out.Data
	}
	// Relative to max(1, |value|). The GELU derivative gets 10 times that: at
	// x ≈ 7 it sums terms up to 20 whose tanh may differ from PyTorch's by an
	// ulp (5.1e-15 measured there).
	const tol = 1e-14

	g := ref.Gelu
	y, d := make([]float64, len(g.X)), make([]float64, len(g.X))
	for i, x := range g.X {
		y[i], d[i] = spmdref.UnaryF("gelu", x), spmdref.UnaryGrad("gelu", x)
	}
	check("gelu", y, g.Y, tol)
	check("gelu'", d, g.DYDX, 10*tol)

	ln := ref.LayerNorm
	rows, dim := ln.Shape[0], ln.Shape[1]
	x, gamma, beta, dy := sim.Tensor{Shape: []int{rows, dim}, Data: ln.X}, sim.Tensor{Shape: []int{dim}, Data: ln.Gamma},
		sim.Tensor{Shape: []int{dim}, Data: ln.Beta}, sim.Tensor{Shape: []int{rows, dim}, Data: ln.DY}
	if ln.Eps != spmdref.LayerNormEps {
		t.Errorf("PyTorch's layer norm ran with eps %g, the reference's is %g", ln.Eps, spmdref.LayerNormEps)
	}
	check("layernorm", eval("layernorm", "Ad,d,d->Ad", x, gamma, beta), ln.Y, tol)
	check("layernorm.grad_x", eval("layernorm.grad_x", "Ad,Ad,d->Ad", dy, x, gamma), ln.DX, tol)
	check("layernorm.grad_gamma", eval("layernorm.grad_gamma", "Ad,Ad->d", dy, x), ln.DGamma, tol)
	check("layernorm.grad_beta", eval("layernorm.grad_beta", "Ad->d", dy), ln.DBeta, tol)

	at := ref.Attention
	qkv := func(v []float64) sim.Tensor { return sim.Tensor{Shape: at.Shape, Data: v} }
	q, k, v, do := qkv(at.Q), qkv(at.K), qkv(at.V), qkv(at.DO)
	check("attention", eval("attention", "Bshe,Bthe,Bthf->Bshf", q, k, v), at.O, tol)
	check("attention.grad_q", eval("attention.grad_q", "Bshf,Bshe,Bthe,Bthf->Bshe", do, q, k, v), at.DQ, tol)
	check("attention.grad_k", eval("attention.grad_k", "Bshf,Bshe,Bthe,Bthf->Bthe", do, q, k, v), at.DK, tol)
	check("attention.grad_v", eval("attention.grad_v", "Bshf,Bshe,Bthe,Bthf->Bthf", do, q, k, v), at.DV, tol)
}
