package kerneltest

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// testEpilogues checks every GEMM epilogue against the float64 reference: the
// GEMM's result R (gemmRef), then the epilogue on it, over transposes, alpha and
// beta, tight and padded C, and M = 1.
func testEpilogues(e *env, dt tensor.DType) {
	rng := rand.New(rand.NewPCG(9, uint64(dt)))
	// The last three are empty (M, N or K = 0): the epilogue's bias gradients
	// are still defined (kernels.EmptyGemm).
	shapes := [][3]int{{1, 17, 9}, {7, 49, 33}, {24, 96, 65}, {65, 100, 130}, {3, 5, 0}, {0, 5, 4}, {4, 0, 6}}
	epis := []kernels.Epilogue{kernels.EpilogueBias, kernels.EpilogueBiasGelu, kernels.EpilogueDGelu,
		kernels.EpilogueDGeluBGrad, kernels.EpilogueBGrad}
	for _, out := range outs(dt) {
		for si, s := range shapes {
			for _, ep := range epis {
				if !e.has(ep.Op()) {
					continue
				}
				for tr := 0; tr < 4; tr++ {
					ab := alphaBetas[(si+tr)%len(alphaBetas)]
					p := outParams(kernels.GemmParams{TransA: tr&1 != 0, TransB: tr&2 != 0, M: s[0], N: s[1], K: s[2],
						Alpha: ab[0], Beta: ab[1], DType: dt, Epilogue: ep}, out).Normalized()
					if (si+tr)%2 == 1 {
						p.LDC += 7
					}
					name := fmt.Sprintf("%v_%v_M%d_N%d_K%d_tA%v_tB%v_a%v_b%v_ldc%d", out, ep, s[0], s[1], s[2], p.TransA, p.TransB, ab[0], ab[1], p.LDC)
					e.runEpilogue(dt, p, rng, name)
				}
			}
		}
	}
}

func (e *env) runEpilogue(dt tensor.DType, p kernels.GemmParams, rng *rand.Rand, name string) {
	t := e.t
	la, lb, lc := p.Lens()
	m, n := p.M, p.N
	a := newBuf(rng, dt, "rand", la)
	b := newBuf(rng, dt, "rand", lb)
	fill := "rand"
	if p.Beta == 0 {
		fill = "nan"
	}
	od := p.Out() // C, Bias and Aux
	c := newBuf(rng, od, fill, lc)
	r, rmag := gemmRef(p, a.all, b.all, c.all)
	// Between-row padding of C keeps whatever it holds.
	wantC, magC := append([]float64(nil), c.all...), make([]float64, lc)
	for i := range magC {
		magC[i] = 1
	}
	var bias, aux *buf
	var wantBias, magBias, wantAux, magAux []float64
	at := func(i, j int) int { return i*p.LDC + j }
	switch p.Epilogue {
	case kernels.EpilogueBias, kernels.EpilogueBiasGelu:
		bias = newBuf(rng, od, "rand", n)
		if p.Epilogue == kernels.EpilogueBiasGelu {
			aux = newBuf(rng, od, "nan", m*n)
			wantAux, magAux = make([]float64, m*n), make([]float64, m*n)
		}
		for i := 0; i < m; i++ {
			for j := 0; j < n; j++ {
				pre, mag := r[at(i, j)]+bias.all[j], rmag[at(i, j)]+math.Abs(bias.all[j])
				if aux == nil {
					wantC[at(i, j)], magC[at(i, j)] = pre, mag
					continue
				}
				wantAux[i*n+j], magAux[i*n+j] = pre, mag
				wantC[at(i, j)], magC[at(i, j)] = kernels.Gelu(pre), 1.2*mag+math.Abs(pre)+1
			}
		}
	case kernels.EpilogueDGelu, kernels.EpilogueDGeluBGrad:
		aux = newBuf(rng, od, "rand", m*n)
		wantAux, magAux = aux.all, make([]float64, m*n)
		for i := range magAux {
			magAux[i] = 1
		}
		if p.Epilogue == kernels.EpilogueDGeluBGrad {
			bias = newBuf(rng, od, "nan", n)
			wantBias, magBias = make([]float64, n), make([]float64, n)
		}
		for i := 0; i < m; i++ {
			for j := 0; j < n; j++ {
				x := aux.all[i*n+j]
				g := kernels.GeluGrad(x)
				v, mag := r[at(i, j)]*g, rmag[at(i, j)]*math.Abs(g)+math.Abs(r[at(i, j)])*(1+math.Abs(x))
				wantC[at(i, j)], magC[at(i, j)] = v, mag
				if bias != nil {
					wantBias[j] += v
					magBias[j] += mag + math.Abs(v)
				}
			}
		}
	case kernels.EpilogueBGrad:
		for i := 0; i < m; i++ {
			for j := 0; j < n; j++ {
				wantC[at(i, j)], magC[at(i, j)] = r[at(i, j)], rmag[at(i, j)]
			}
		}
		bias = newBuf(rng, od, "nan", m)
		wantBias, magBias = make([]float64, m), make([]float64, m)
		for i := 0; i < m; i++ {
			for k := 0; k < p.K; k++ {
				v := a.all[i*p.LDA+k]
				if p.TransA {
					v = a.all[k*p.LDA+i]
				}
				wantBias[i] += v
				magBias[i] += math.Abs(v)
			}
		}
	}
	o := kernels.GemmOperands{A: e.dev(a), B: e.dev(b), C: e.dev(c), Bias: e.dev(bias), Aux: e.dev(aux)}
	if err := e.k.Gemm(p, o); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	e.back(c, o.C)
	compare(t, name+"_C", od, c, wantC, magC, p.K+20)
	if wantAux != nil {
		e.back(aux, o.Aux)
		compare(t, name+"_aux", od, aux, wantAux, magAux, p.K+20)
	}
	if wantBias != nil {
		e.back(bias, o.Bias)
		compare(t, name+"_bias", od, bias, wantBias, magBias, max(m, p.K)+20)
	}
}

// has reports whether the kernels under test implement op (a provider or a
// dispatcher says so; anything else is taken to implement every op).
func (e *env) has(op kernels.Op) bool {
	if h, ok := e.k.(interface{ Has(kernels.Op) bool }); ok {
		return h.Has(op)
	}
	return true
}

// testElementwise checks BiasGrad, Axpy and MSE against float64.
func testElementwise(e *env, dt tensor.DType) {
	t := e.t
	rng := rand.New(rand.NewPCG(10, uint64(dt)))
	for _, s := range [][2]int{{0, 3}, {4, 0}, {1, 1}, {5, 17}, {300, 97}, {2, 70000}} {
		m, n := s[0], s[1]
		name := fmt.Sprintf("M%d_N%d", m, n)
		dy := newBuf(rng, dt, "rand", m, n)
		for _, acc := range []bool{false, true} {
			for _, od := range outs(dt) { // a bfloat16 dy may have a float32 db
				testBiasGrad(e, name, rng, dy, od, m, n, acc)
			}
		}
		// y += alpha·x
		x := newBuf(rng, dt, "rand", m, n)
		y := newBuf(rng, dt, "rand", m, n)
		want, mag := make([]float64, m*n), make([]float64, m*n)
		const alpha = -0.37
		for i := range want {
			want[i] = y.all[i] + alpha*x.all[i]
			mag[i] = math.Abs(y.all[i]) + math.Abs(alpha*x.all[i])
		}
		yd := e.dev(y)
		if err := e.k.Axpy(alpha, e.dev(x), yd); err != nil {
			t.Fatalf("%s axpy: %v", name, err)
		}
		e.back(y, yd)
		compare(t, name+"_axpy", dt, y, want, mag, 1)
		// MSE: dy = scale·(y − target), sum = Σ (y − target)².
		target := newBuf(rng, dt, "rand", m, n)
		yy := newBuf(rng, dt, "rand", m, n)
		g := newBuf(rng, dt, "nan", m, n)
		scale := 2 / float64(max(m*n, 1))
		wantg, magg := make([]float64, m*n), make([]float64, m*n)
		var wantSum, magSum float64
		for i := range wantg {
			d := yy.all[i] - target.all[i]
			wantg[i], magg[i] = scale*d, scale*(math.Abs(yy.all[i])+math.Abs(target.all[i]))
			wantSum += d * d
			magSum += (math.Abs(yy.all[i]) + math.Abs(target.all[i])) * (math.Abs(yy.all[i]) + math.Abs(target.all[i]))
		}
		sum := newBuf(rng, tensor.Float64, "nan", 1)
		gd, sd := e.dev(g), e.dev(sum)
		if err := e.k.MSE(gd, sd, e.dev(yy), e.dev(target), scale); err != nil {
			t.Fatalf("%s mse: %v", name, err)
		}
		e.back(g, gd)
		e.back(sum, sd)
		compare(t, name+"_mse_grad", dt, g, wantg, magg, 2)
		// The squares are float32 products in float32 runs: allow their rounding.
		if got := sum.value(0); math.Abs(got-wantSum) > 1e-6*magSum+1e-30 {
			t.Errorf("%s mse: sum %v, want %v", name, got, wantSum)
		}
	}
}

func testBiasGrad(e *env, name string, rng *rand.Rand, dy *buf, od tensor.DType, m, n int, acc bool) {
	t := e.t
	fill := "nan"
	if acc {
		fill = "rand"
	}
	db := newBuf(rng, od, fill, n)
	want, mag := make([]float64, n), make([]float64, n)
	for j := 0; j < n; j++ {
		if acc {
			want[j], mag[j] = db.all[j], math.Abs(db.all[j])
		}
		for i := 0; i < m; i++ {
			want[j] += dy.all[i*n+j]
			mag[j] += math.Abs(dy.all[i*n+j])
		}
	}
	d := e.dev(db)
	if err := e.k.BiasGrad(d, e.dev(dy), acc); err != nil {
		t.Fatalf("%s bias_grad: %v", name, err)
	}
	e.back(db, d)
	compare(t, fmt.Sprintf("%s_bias_grad_%v_acc%v", name, od, acc), od, db, want, mag, m)
}
