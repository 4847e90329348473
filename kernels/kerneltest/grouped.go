package kerneltest

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// groupedRows are the experts' row counts the grouped GEMM is tested on: one
// expert (the dense op), balanced, skewed with an empty expert, and every row
// to one expert.
var groupedRows = []struct {
	name string
	rows []int
}{
	{"E1", []int{37}},
	{"balanced", []int{6, 6, 6, 6, 6, 6, 6, 6}},
	{"skewed", []int{1, 40, 3, 0, 17, 2, 5, 8}},
	{"one", []int{0, 0, 0, 50, 0, 0, 0, 0}},
}

// testGrouped checks each grouped GEMM against a per-expert loop of the dense
// linear ops on the same provider, with NaN-filled outputs (an empty expert's
// weight and bias gradients must be written: zero, or dw kept exactly when
// accumulating) and NaN guard bands.
func testGrouped(e *env, dt tensor.DType) {
	if !e.has(kernels.OpGroupedGemm) {
		return
	}
	rng := rand.New(rand.NewPCG(12, uint64(dt)))
	shapes := [][2]int{{33, 47}, {16, 1}}
	if e.cfg.Short {
		shapes = shapes[:1]
	}
	for _, od := range outs(dt) {
		for _, c := range groupedRows {
			for _, s := range shapes {
				g := &groupedCase{e: e, rng: rng, dt: dt, od: od, rows: c.rows, n: s[0], k: s[1],
					name: fmt.Sprintf("%v_%s_N%d_K%d", od, c.name, s[0], s[1])}
				g.init()
				g.forward()
				g.input()
				g.weight()
				g.bias()
			}
		}
	}
	testGroupedErrors(e, dt)
	if e.cfg.Deterministic {
		testGroupedDeterminism(e, dt)
	}
}

// groupedCase is one grouped problem: its packed operands on the host.
type groupedCase struct {
	e        *env
	rng      *rand.Rand
	dt, od   tensor.DType
	rows     []int
	n, k     int
	name     string
	x, dy, w *buf // x[R,K], dy[R,N], w[E,N,K]
	b, aux   *buf // b[E,N] and aux[R,K] (a pre-activation) of od
}

func (g *groupedCase) init() {
	r, ee := 0, len(g.rows)
	for _, m := range g.rows {
		r += m
	}
	g.x = newBuf(g.rng, g.dt, "rand", r, g.k)
	g.dy = newBuf(g.rng, g.dt, "rand", r, g.n)
	g.w = newBuf(g.rng, g.dt, "rand", ee, g.n, g.k)
	g.b = newBuf(g.rng, g.od, "rand", ee, g.n)
	g.aux = newBuf(g.rng, g.od, "rand", r, g.k)
}

// part returns elements [off, off+Π shape) of src as a new buffer of dtype dt.
func part(src *buf, dt tensor.DType, off int, shape ...int) *buf {
	n := tensor.NumElements(shape)
	b := newBuf(nil, dt, "zero", shape...)
	for i := 0; i < n; i++ {
		b.all[i] = src.all[off+i]
		setAt(b.t, i, b.all[i])
	}
	return b
}

// fill is an output of dtype dt and shape: NaN, or when old is set a copy of it.
func (g *groupedCase) out(dt tensor.DType, old *buf, shape ...int) *buf {
	if old != nil {
		return part(old, dt, 0, shape...)
	}
	return newBuf(g.rng, dt, "nan", shape...)
}

// run calls f on device copies of bufs (nil stays nil) and copies the
// outputs (outs of them) back.
func (g *groupedCase) run(what string, outs []*buf, f func(ts []*tensor.Tensor) error, bufs ...*buf) {
	ts := make([]*tensor.Tensor, len(bufs))
	for i, b := range bufs {
		ts[i] = g.e.dev(b)
	}
	if err := f(ts); err != nil {
		g.e.t.Fatalf("%s %s: %v", g.name, what, err)
	}
	for _, o := range outs {
		for i, b := range bufs {
			if b == o && b != nil {
				g.e.back(b, ts[i])
			}
		}
	}
}

// place copies an expert's result src into want at off (and its magnitudes).
func place(want []float64, off int, src *buf) {
	for i := 0; i < src.size; i++ {
		want[off+i] = src.value(i)
	}
}

// near checks got against want (the dense ops' results, which round
// separately) within a bound scaled by mag and the inner size k: each a
// float32 or float64 accumulation, bfloat16 outputs one rounding each.
func near(e *env, what string, got *buf, want, mag []float64, k int) {
	t := e.t
	t.Helper()
	eps := 1.2e-7
	if got.t.DType() == tensor.Float64 {
		eps = 2.3e-16
	}
	errs := 0
	for i := range want {
		gv := got.value(i)
		tol := 8 * eps * float64(k+4) * (mag[i] + 1e-30)
		if got.t.DType() == tensor.BFloat16 {
			tol += tensor.BF16Epsilon * (math.Abs(want[i]) + tol)
		}
		if math.IsNaN(want[i]) != math.IsNaN(gv) || math.Abs(gv-want[i]) > tol {
			if errs < 5 {
				t.Errorf("%s: element %d = %v, want %v (tol %.3g)", what, i, gv, want[i], tol)
			}
			errs++
		}
	}
	if errs > 5 {
		t.Errorf("%s: %d elements wrong", what, errs)
	}
	got.checkGuards(t, what)
}

// absSum is Σ_i |a[i]·b[i]| over strided vectors.
func absSum(a []float64, ao, as int, b []float64, bo, bs, n int) float64 {
	s := 0.0
	for i := 0; i < n; i++ {
		s += math.Abs(a[ao+i*as] * b[bo+i*bs])
	}
	return s
}

// forward checks y_e = x_e·w_eᵀ (+ b_e) (gelu, keeping aux).
func (g *groupedCase) forward() {
	n, k := g.n, g.k
	r := g.x.t.Dim(0)
	for _, epi := range []kernels.Epilogue{kernels.EpilogueNone, kernels.EpilogueBias, kernels.EpilogueBiasGelu} {
		y := g.out(g.od, nil, r, n)
		var aux, bias *buf
		if epi != kernels.EpilogueNone {
			bias = g.b
		}
		if epi == kernels.EpilogueBiasGelu {
			aux = g.out(g.od, nil, r, n)
		}
		g.run("forward "+epi.String(), []*buf{y, aux}, func(ts []*tensor.Tensor) error {
			if aux != nil {
				return kernels.GroupedLinearForwardGelu(g.e.k, g.rows, ts[0], ts[1], ts[2], ts[3], ts[4])
			}
			return kernels.GroupedLinearForward(g.e.k, g.rows, ts[0], ts[2], ts[3], ts[4])
		}, y, aux, g.x, g.w, bias)
		wantY, magY := make([]float64, r*n), make([]float64, r*n)
		wantAux := make([]float64, r*n)
		off := 0
		for ex, m := range g.rows {
			ye, auxe := g.out(g.od, nil, m, n), (*buf)(nil)
			xe, we := part(g.x, g.dt, off*k, m, k), part(g.w, g.dt, ex*n*k, n, k)
			var be *buf
			if bias != nil {
				be = part(g.b, g.od, ex*n, n)
			}
			if aux != nil {
				auxe = g.out(g.od, nil, m, n)
			}
			g.run("dense forward", []*buf{ye, auxe}, func(ts []*tensor.Tensor) error {
				if auxe != nil {
					return kernels.LinearForwardGelu(g.e.k, ts[0], ts[1], ts[2], ts[3], ts[4])
				}
				return kernels.LinearForward(g.e.k, ts[0], ts[2], ts[3], ts[4])
			}, ye, auxe, xe, we, be)
			place(wantY, off*n, ye)
			if auxe != nil {
				place(wantAux, off*n, auxe)
			}
			for i := 0; i < m; i++ {
				for j := 0; j < n; j++ {
					mag := absSum(g.x.all, (off+i)*k, 1, g.w.all, (ex*n+j)*k, 1, k)
					if be != nil {
						mag += math.Abs(be.all[j])
					}
					if auxe != nil {
						mag = 1.2*mag + math.Abs(auxe.value(i*n+j)) + 1
					}
					magY[(off+i)*n+j] = mag
				}
			}
			off += m
		}
		near(g.e, g.name+"_forward_"+epi.String(), y, wantY, magY, k)
		if aux != nil {
			near(g.e, g.name+"_forward_aux", aux, wantAux, magY, k)
		}
	}
}

// testGroupedDeterminism checks that a grouped GEMM whose experts are large
// (run alone on every core) and small (run side by side) gives bit-identical
// results on 1 and 4 threads.
func testGroupedDeterminism(e *env, dt tensor.DType) {
	rng := rand.New(rand.NewPCG(14, uint64(dt)))
	rows := []int{5, 200, 0, 3, 7, 1, 150, 9}
	const n, k = 100, 300
	r := 375
	x, w := newBuf(rng, dt, "rand", r, k), newBuf(rng, dt, "rand", len(rows), n, k)
	b := newBuf(rng, dt, "rand", len(rows), n)
	var results [2][]float64
	for i, threads := range []int{1, 4} {
		kk, err := e.cfg.New(threads)
		if err != nil {
			e.t.Fatal(err)
		}
		y := newBuf(rng, dt, "nan", r, n)
		dy := e.dev(y)
		if err := kernels.GroupedLinearForward(kk, rows, dy, e.dev(x), e.dev(w), e.dev(b)); err != nil {
			e.t.Fatal(err)
		}
		e.back(y, dy)
		for j := 0; j < r*n; j++ {
			results[i] = append(results[i], y.value(j))
		}
	}
	for j := range results[0] {
		if math.Float64bits(results[0][j]) != math.Float64bits(results[1][j]) {
			e.t.Fatalf("grouped %v: element %d differs between 1 and 4 threads: %v vs %v", dt, j, results[0][j], results[1][j])
		}
	}
}
