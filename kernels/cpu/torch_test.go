package cpu_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/kernels/kerneltest"
	"github.com/meshrun/meshrun/tensor"
)

// f64s is a float64 tensor holding a copy of v.
func f64s(t *testing.T, v []float64, shape ...int) *tensor.Tensor {
	x, err := tensor.FromFloat64(append([]float64(nil), v...), shape...)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// within is near that also logs how close got is to want, relative to
// max(1, |want|).
func within(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	near(t, what, got, want, tol)
	worst := 0.0
	for i := range got {
		worst = max(worst, math.Abs(got[i]-want[i])/max(1, math.Abs(want[i])))
	}
	t.Logf("%s: within %.2g of PyTorch", what, worst)
}

// TestTransformerMatchesPyTorch: the transformer ops against PyTorch's values
// for them (kerneltest.Torch(), written by PyTorch in float64 with autograd
// for the gradients; AdamW by torch.optim.AdamW on float32): the other tests
// of this file compare with Go written from the same formulas, this one with
// code meshrun does not share. float64 within 1e-14 relative to max(1,
// |value|) (3.5e-16 measured: the last bits), AdamW's float32 parameters
// within 2.5e-7, a few float32 ulps (bit for bit on amd64).
func TestTransformerMatchesPyTorch(t *testing.T) {
	ref := kerneltest.Torch()
	p, _ := cpu.New(cpu.Options{Threads: 2})
	const tol = 1e-14
	t.Run("layer_norm", func(t *testing.T) {
		r := ref.LayerNorm
		rows, d := r.Shape[0], r.Shape[1]
		x, gamma, beta, dy := f64s(t, r.X, rows, d), f64s(t, r.Gamma, d), f64s(t, r.Beta, d), f64s(t, r.DY, rows, d)
		y, stats := zeros(rows, d), zeros(rows, 2)
		if err := p.LayerNorm(y, stats, x, gamma, beta, r.Eps); err != nil {
			t.Fatal(err)
		}
		within(t, "y", y.Float64(), r.Y, tol)
		dx, dg, db := zeros(rows, d), zeros(d), zeros(d)
		if err := p.LayerNormBackward(dx, dg, db, dy, x, gamma, stats, false); err != nil {
			t.Fatal(err)
		}
		within(t, "dx", dx.Float64(), r.DX, tol)
		within(t, "dgamma", dg.Float64(), r.DGamma, tol)
		within(t, "dbeta", db.Float64(), r.DBeta, tol)
	})
	t.Run("attention", func(t *testing.T) {
		r := ref.Attention
		b, s, h, e := r.Shape[0], r.Shape[1], r.Shape[2], r.Shape[3]
		q, k, v, do := f64s(t, r.Q, b, s, h, e), f64s(t, r.K, b, s, h, e), f64s(t, r.V, b, s, h, e), f64s(t, r.DO, b, s, h, e)
		o, lse := zeros(b, s, h, e), zeros(b, h, s)
		if err := p.Attention(o, lse, q, k, v, true); err != nil {
			t.Fatal(err)
		}
		within(t, "o", o.Float64(), r.O, tol)
		dq, dk, dv := zeros(b, s, h, e), zeros(b, s, h, e), zeros(b, s, h, e)
		if err := p.AttentionBackward(dq, dk, dv, do, q, k, v, o, lse, true); err != nil {
			t.Fatal(err)
		}
		within(t, "dq", dq.Float64(), r.DQ, tol)
		within(t, "dk", dk.Float64(), r.DK, tol)
		within(t, "dv", dv.Float64(), r.DV, tol)
	})
	t.Run("cross_entropy", func(t *testing.T) {
		r := ref.CrossEntropy
		logits, targets := f64s(t, r.Logits, r.Rows, r.Vocab), zeros(r.Rows)
		for i, v := range r.Targets {
			targets.Float64()[i] = float64(v)
		}
		// One shard holding the whole vocabulary, combined alone.
		st, lse, loss := zeros(r.Rows, 3), zeros(r.Rows), zeros(1)
		if err := p.CrossEntropy(st, logits, targets, 0); err != nil {
			t.Fatal(err)
		}
		if err := p.CrossEntropyCombine(lse, loss, f64s(t, st.Float64(), 1, r.Rows, 3)); err != nil {
			t.Fatal(err)
		}
		var sum float64
		for _, l := range r.Loss {
			sum += l
		}
		within(t, "loss", loss.Float64(), []float64{sum}, tol)
		rowLoss := make([]float64, r.Rows)
		for i := range rowLoss {
			rowLoss[i] = lse.Float64()[i] - r.Logits[i*r.Vocab+r.Targets[i]]
		}
		within(t, "row losses", rowLoss, r.Loss, tol)
		dl := zeros(r.Rows, r.Vocab)
		if err := p.CrossEntropyBackward(dl, logits, targets, lse, 0, 1/float64(r.Rows)); err != nil {
			t.Fatal(err)
		}
		within(t, "dlogits", dl.Float64(), r.DLogitsMean, tol)
	})
	t.Run("adamw", func(t *testing.T) {
		r := ref.AdamW
		n := len(r.Param)
		param, m, v := tensor.New(tensor.Float32, n), tensor.New(tensor.Float32, n), tensor.New(tensor.Float32, n)
		for i, x := range r.Param {
			param.Float32()[i] = float32(x)
		}
		for step, g := range r.Grads {
			grad := tensor.New(tensor.Float32, n)
			for i, x := range g {
				grad.Float32()[i] = float32(x)
			}
			a := kernels.AdamWParams{LR: r.LR, Beta1: r.Beta1, Beta2: r.Beta2, Eps: r.Eps, WeightDecay: r.WeightDecay, Step: step + 1}
			if err := p.AdamW(a, param, grad, m, v); err != nil {
				t.Fatal(err)
			}
			got := make([]float64, n)
			for i, x := range param.Float32() {
				got[i] = float64(x)
			}
			within(t, fmt.Sprintf("param after step %d", step+1), got, r.After[step], 2.5e-7)
		}
	})
}
