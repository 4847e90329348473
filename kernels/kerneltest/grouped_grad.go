package kerneltest

import (
	"errors"
	"math"
	"math/rand/v2"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// input checks dx_e = dy_e·w_e (⊙ gelu'(aux_e); db_e = Σ rows of dx_e).
func (g *groupedCase) input() {
	n, k, ee := g.n, g.k, len(g.rows)
	r := g.x.t.Dim(0)
	for _, epi := range []kernels.Epilogue{kernels.EpilogueNone, kernels.EpilogueDGelu, kernels.EpilogueDGeluBGrad} {
		dx := g.out(g.od, nil, r, k)
		var aux, db *buf
		if epi != kernels.EpilogueNone {
			aux = g.aux
		}
		if epi == kernels.EpilogueDGeluBGrad {
			db = g.out(g.od, nil, ee, k)
		}
		g.run("backward input "+epi.String(), []*buf{dx, db}, func(ts []*tensor.Tensor) error {
			if aux != nil {
				return kernels.GroupedLinearBackwardInputGelu(g.e.k, g.rows, ts[0], ts[1], ts[2], ts[3], ts[4])
			}
			return kernels.GroupedLinearBackwardInput(g.e.k, g.rows, ts[0], ts[2], ts[3])
		}, dx, db, g.dy, g.w, aux)
		wantDx, magDx := make([]float64, r*k), make([]float64, r*k)
		wantDb, magDb := make([]float64, ee*k), make([]float64, ee*k)
		off := 0
		for ex, m := range g.rows {
			dxe, dbe := g.out(g.od, nil, m, k), (*buf)(nil)
			dye, we := part(g.dy, g.dt, off*n, m, n), part(g.w, g.dt, ex*n*k, n, k)
			var auxe *buf
			if aux != nil {
				auxe = part(g.aux, g.od, off*k, m, k)
			}
			if db != nil {
				dbe = g.out(g.od, nil, k)
			}
			g.run("dense backward input", []*buf{dxe, dbe}, func(ts []*tensor.Tensor) error {
				if auxe != nil {
					return kernels.LinearBackwardInputGelu(g.e.k, ts[0], ts[1], ts[2], ts[3], ts[4])
				}
				return kernels.LinearBackwardInput(g.e.k, ts[0], ts[2], ts[3])
			}, dxe, dbe, dye, we, auxe)
			place(wantDx, off*k, dxe)
			if dbe != nil {
				place(wantDb, ex*k, dbe)
			}
			for i := 0; i < m; i++ {
				for j := 0; j < k; j++ {
					mag := 1.2*absSum(g.dy.all, (off+i)*n, 1, g.w.all, ex*n*k+j, k, n) + 1
					magDx[(off+i)*k+j] = mag
					magDb[ex*k+j] += mag
				}
			}
			off += m
		}
		near(g.e, g.name+"_backward_input_"+epi.String(), dx, wantDx, magDx, n)
		if db != nil {
			near(g.e, g.name+"_backward_input_bias", db, wantDb, magDb, n+r)
		}
	}
}

// weight checks dw_e (+)= dy_eᵀ·x_e and db_e = Σ rows of dy_e: an empty
// expert's dw_e is zero (kept exactly when accumulating) and its db_e zero.
func (g *groupedCase) weight() {
	n, k, ee := g.n, g.k, len(g.rows)
	for _, acc := range []bool{false, true} {
		for _, bias := range []bool{false, true} {
			var old *buf
			if acc {
				old = newBuf(g.rng, g.od, "rand", ee, n, k)
			}
			dw := g.out(g.od, old, ee, n, k)
			var db *buf
			if bias {
				db = g.out(g.od, nil, ee, n)
			}
			g.run("backward weight", []*buf{dw, db}, func(ts []*tensor.Tensor) error {
				return kernels.GroupedLinearBackwardWeight(g.e.k, g.rows, ts[0], ts[1], ts[2], ts[3], acc)
			}, dw, db, g.dy, g.x)
			wantDw, magDw := make([]float64, ee*n*k), make([]float64, ee*n*k)
			wantDb, magDb := make([]float64, ee*n), make([]float64, ee*n)
			off := 0
			for ex, m := range g.rows {
				var olde *buf
				if old != nil {
					olde = part(old, g.od, ex*n*k, n, k)
				}
				dwe, dbe := g.out(g.od, olde, n, k), (*buf)(nil)
				if bias {
					dbe = g.out(g.od, nil, n)
				}
				dye, xe := part(g.dy, g.dt, off*n, m, n), part(g.x, g.dt, off*k, m, k)
				g.run("dense backward weight", []*buf{dwe, dbe}, func(ts []*tensor.Tensor) error {
					if dbe != nil {
						return kernels.LinearBackwardWeightBias(g.e.k, ts[0], ts[1], ts[2], ts[3], acc)
					}
					return kernels.LinearBackwardWeight(g.e.k, ts[0], ts[2], ts[3], acc)
				}, dwe, dbe, dye, xe)
				place(wantDw, ex*n*k, dwe)
				if dbe != nil {
					place(wantDb, ex*n, dbe)
				}
				for i := 0; i < n; i++ {
					for j := 0; j < k; j++ {
						at := ex*n*k + i*k + j
						magDw[at] = absSum(g.dy.all, off*n+i, n, g.x.all, off*k+j, k, m)
						if olde != nil {
							magDw[at] += math.Abs(olde.all[i*k+j])
						}
						if m == 0 { // written exactly: zero, or the old value
							wantDw[at] = 0
							if olde != nil {
								wantDw[at] = olde.all[i*k+j]
							}
						}
					}
					magDb[ex*n+i] = absSum(g.dy.all, off*n+i, n, ones(m), 0, 1, m)
					if m == 0 {
						wantDb[ex*n+i] = 0
					}
				}
				off += m
			}
			what := g.name + "_backward_weight"
			if acc {
				what += "_acc"
			}
			near(g.e, what, dw, wantDw, magDw, g.x.t.Dim(0))
			if db != nil {
				near(g.e, what+"_bias", db, wantDb, magDb, g.x.t.Dim(0))
			}
		}
	}
}

// bias checks db_e (+)= Σ rows of dy_e alone against the dense bias
// gradient: an empty expert's db_e zero, or kept exactly when accumulating.
func (g *groupedCase) bias() {
	n, ee := g.n, len(g.rows)
	r := g.x.t.Dim(0)
	for _, acc := range []bool{false, true} {
		var old *buf
		if acc {
			old = newBuf(g.rng, g.od, "rand", ee, n)
		}
		db := g.out(g.od, old, ee, n)
		g.run("backward bias", []*buf{db}, func(ts []*tensor.Tensor) error {
			return kernels.GroupedLinearBackwardBias(g.e.k, g.rows, ts[0], ts[1], acc)
		}, db, g.dy)
		want, mag := make([]float64, ee*n), make([]float64, ee*n)
		off := 0
		for ex, m := range g.rows {
			var olde *buf
			if old != nil {
				olde = part(old, g.od, ex*n, n)
			}
			dbe := g.out(g.od, olde, n)
			g.run("dense backward bias", []*buf{dbe}, func(ts []*tensor.Tensor) error {
				return kernels.LinearBackwardBias(g.e.k, ts[0], ts[1], acc)
			}, dbe, part(g.dy, g.dt, off*n, m, n))
			place(want, ex*n, dbe)
			for j := 0; j < n; j++ {
				mag[ex*n+j] = absSum(g.dy.all, off*n+j, n, ones(m), 0, 1, m)
				if olde != nil {
					mag[ex*n+j] += math.Abs(olde.all[j])
				}
				if m == 0 { // written exactly: zero, or the old value
					want[ex*n+j] = 0
					if olde != nil {
						want[ex*n+j] = olde.all[j]
					}
				}
			}
			off += m
		}
		what := g.name + "_backward_bias"
		if acc {
			what += "_acc"
		}
		near(g.e, what, db, want, mag, r)
	}
}

// testGroupedErrors checks that bad grouped operands are refused with
// errors wrapping tensor's ErrShape or ErrDType.
func testGroupedErrors(e *env, dt tensor.DType) {
	t := e.t
	rng := rand.New(rand.NewPCG(13, uint64(dt)))
	rows := []int{2, 0, 3}
	x := e.dev(newBuf(rng, dt, "rand", 5, 4))
	w := e.dev(newBuf(rng, dt, "rand", 3, 6, 4))
	y := e.dev(newBuf(rng, dt, "nan", 5, 6))
	other := tensor.Float64
	if dt == tensor.Float64 {
		other = tensor.Float32
	}
	for _, c := range []struct {
		what string
		err  error
		f    func() error
	}{
		{"rows summing to another count", kernels.ErrShape, func() error {
			return kernels.GroupedLinearForward(e.k, []int{2, 0, 2}, y, x, w, nil)
		}},
		{"negative rows", kernels.ErrShape, func() error {
			return kernels.GroupedLinearForward(e.k, []int{3, -1, 3}, y, x, w, nil)
		}},
		{"no experts", kernels.ErrShape, func() error {
			return kernels.GroupedLinearForward(e.k, nil, y, x, w, nil)
		}},
		{"experts and weights disagree", kernels.ErrShape, func() error {
			return kernels.GroupedLinearForward(e.k, []int{5, 0}, y, x, w, nil)
		}},
		{"gelu without aux", kernels.ErrShape, func() error {
			return e.k.GroupedGemm(kernels.GroupedParams{Rows: rows, N: 6, K: 4, DType: dt, Epilogue: kernels.EpilogueBiasGelu},
				kernels.GemmOperands{A: x, B: w, C: y, Bias: e.dev(newBuf(rng, dt, "rand", 3, 6))})
		}},
		{"an epilogue of another kind", kernels.ErrShape, func() error {
			return e.k.GroupedGemm(kernels.GroupedParams{Rows: rows, N: 6, K: 4, DType: dt, Epilogue: kernels.EpilogueBGrad},
				kernels.GemmOperands{A: x, B: w, C: y, Bias: e.dev(newBuf(rng, dt, "rand", 3, 6))})
		}},
		{"mixed dtypes", kernels.ErrDType, func() error {
			return kernels.GroupedLinearForward(e.k, rows, y, e.dev(newBuf(rng, other, "rand", 5, 4)), w, nil)
		}},
	} {
		if err := c.f(); !errors.Is(err, c.err) {
			t.Errorf("grouped gemm, %s: got %v, want %v", c.what, err, c.err)
		}
	}
}
