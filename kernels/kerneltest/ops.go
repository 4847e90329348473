package kerneltest

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

func testGemv(e *env, dt tensor.DType) {
	rng := rand.New(rand.NewPCG(3, uint64(dt)))
	for _, s := range [][2]int{{0, 3}, {3, 0}, {1, 1}, {3, 17}, {4, 16}, {5, 33}, {7, 1100}, {66, 47}, {130, 2100}} {
		for _, trans := range []bool{false, true} {
			for ai, ab := range alphaBetas {
				p := kernels.GemvParams{Trans: trans, M: s[0], N: s[1], Alpha: ab[0], Beta: ab[1], DType: dt}.Normalized()
				if ai%2 == 1 {
					p.LDA += 3
				}
				la, lx, ly := p.Lens()
				a := newBuf(rng, dt, "rand", la)
				x := newBuf(rng, dt, "rand", lx)
				fill := "rand"
				if p.Beta == 0 {
					fill = "nan"
				}
				y := newBuf(rng, dt, fill, ly)
				want := make([]float64, ly)
				mag := make([]float64, ly)
				for o := 0; o < ly; o++ {
					var sum, m float64
					for i := 0; i < lx && p.Alpha != 0; i++ {
						var av float64
						if trans {
							av = a.all[i*p.LDA+o]
						} else {
							av = a.all[o*p.LDA+i]
						}
						sum += av * x.all[i]
						m += math.Abs(av * x.all[i])
					}
					yv := 0.0
					if p.Beta != 0 {
						yv = y.all[o]
					}
					want[o] = p.Alpha*sum + p.Beta*yv
					mag[o] = math.Abs(p.Alpha)*m + math.Abs(p.Beta*yv)
				}
				dy := e.dev(y)
				name := fmt.Sprintf("M%d_N%d_trans%v_a%v_b%v_lda%d", s[0], s[1], trans, ab[0], ab[1], p.LDA)
				if err := e.k.Gemv(p, e.dev(a), e.dev(x), dy); err != nil {
					e.t.Fatalf("%s: %v", name, err)
				}
				e.back(y, dy)
				compare(e.t, name, dt, y, want, mag, lx)
			}
		}
	}
}

// linear reference: y[m,n] = Σ_k x[m,k] w[n,k] (+ b[n]).
func testLinear(e *env, dt tensor.DType) {
	for _, od := range outs(dt) {
		testLinearOut(e, dt, od)
	}
}

// testLinearOut runs the linear ops with inputs (x, w, dy) of dt and outputs
// (y, b, dx, dw, db) of od.
func testLinearOut(e *env, dt, od tensor.DType) {
	t := e.t
	rng := rand.New(rand.NewPCG(4, uint64(dt)))
	for _, s := range []struct {
		lead []int
		n, k int
	}{{[]int{1}, 33, 47}, {[]int{2, 3}, 49, 17}, {[]int{9}, 8, 1}, {[]int{17}, 50, 300}, {[]int{0}, 4, 5}, {[]int{3}, 5, 0}, {[]int{4}, 0, 6}} {
		m := tensor.NumElements(s.lead)
		xs := append(append([]int(nil), s.lead...), s.k)
		ys := append(append([]int(nil), s.lead...), s.n)
		name := fmt.Sprintf("%v_M%d_N%d_K%d", od, m, s.n, s.k)
		x := newBuf(rng, dt, "rand", xs...)
		w := newBuf(rng, dt, "rand", s.n, s.k)
		b := newBuf(rng, od, "rand", s.n)
		dy := newBuf(rng, dt, "rand", ys...)
		mm := func(rows, cols, inner int, f func(i, j, k int) (float64, float64)) ([]float64, []float64) {
			want, mag := make([]float64, rows*cols), make([]float64, rows*cols)
			for i := 0; i < rows; i++ {
				for j := 0; j < cols; j++ {
					for k := 0; k < inner; k++ {
						p, q := f(i, j, k)
						want[i*cols+j] += p * q
						mag[i*cols+j] += math.Abs(p * q)
					}
				}
			}
			return want, mag
		}
		for _, bias := range []bool{true, false} {
			y := newBuf(rng, od, "nan", ys...)
			want, mag := mm(m, s.n, s.k, func(i, j, k int) (float64, float64) { return x.all[i*s.k+k], w.all[j*s.k+k] })
			var bt *tensor.Tensor
			if bias {
				for i := range want {
					want[i] += b.all[i%s.n]
					mag[i] += math.Abs(b.all[i%s.n])
				}
				bt = e.dev(b)
			}
			dyv := e.dev(y)
			if err := kernels.LinearForward(e.k, dyv, e.dev(x), e.dev(w), bt); err != nil {
				t.Fatalf("%s forward: %v", name, err)
			}
			e.back(y, dyv)
			compare(t, name+fmt.Sprintf("_forward_bias%v", bias), dt, y, want, mag, s.k)
		}
		dx := newBuf(rng, od, "nan", xs...)
		want, mag := mm(m, s.k, s.n, func(i, j, k int) (float64, float64) { return dy.all[i*s.n+k], w.all[k*s.k+j] })
		ddx := e.dev(dx)
		if err := kernels.LinearBackwardInput(e.k, ddx, e.dev(dy), e.dev(w)); err != nil {
			t.Fatalf("%s backward input: %v", name, err)
		}
		e.back(dx, ddx)
		compare(t, name+"_backward_input", dt, dx, want, mag, s.n)

		for _, acc := range []bool{false, true} {
			fill := "nan"
			if acc {
				fill = "rand"
			}
			dw := newBuf(rng, od, fill, s.n, s.k)
			want, mag := mm(s.n, s.k, m, func(i, j, k int) (float64, float64) { return dy.all[k*s.n+i], x.all[k*s.k+j] })
			db := newBuf(rng, od, fill, s.n)
			wantb, magb := mm(1, s.n, m, func(_, j, k int) (float64, float64) { return dy.all[k*s.n+j], 1 })
			if acc {
				for i := range want {
					want[i] += dw.all[i]
					mag[i] += math.Abs(dw.all[i])
				}
				for i := range wantb {
					wantb[i] += db.all[i]
					magb[i] += math.Abs(db.all[i])
				}
			}
			ddw, ddb := e.dev(dw), e.dev(db)
			if err := kernels.LinearBackwardWeight(e.k, ddw, e.dev(dy), e.dev(x), acc); err != nil {
				t.Fatalf("%s backward weight: %v", name, err)
			}
			if err := kernels.LinearBackwardBias(e.k, ddb, e.dev(dy), acc); err != nil {
				t.Fatalf("%s backward bias: %v", name, err)
			}
			e.back(dw, ddw)
			e.back(db, ddb)
			compare(t, name+fmt.Sprintf("_backward_weight_acc%v", acc), dt, dw, want, mag, m)
			compare(t, name+fmt.Sprintf("_backward_bias_acc%v", acc), dt, db, wantb, magb, m)
			// The same with the bias gradient fused into the weight-gradient GEMM
			// (the bias gradient always overwrites).
			dw2 := newBuf(rng, od, "nan", s.n, s.k)
			if acc {
				copy(dw2.all, dw.all)
				for i := range dw2.all {
					setAt(dw2.t, i, dw2.all[i])
				}
			}
			db2 := newBuf(rng, od, "nan", s.n)
			wantb2, magb2 := mm(1, s.n, m, func(_, j, k int) (float64, float64) { return dy.all[k*s.n+j], 1 })
			want2, mag2 := mm(s.n, s.k, m, func(i, j, k int) (float64, float64) { return dy.all[k*s.n+i], x.all[k*s.k+j] })
			if acc {
				for i := range want2 {
					want2[i] += dw2.all[i]
					mag2[i] += math.Abs(dw2.all[i])
				}
			}
			ddw2, ddb2 := e.dev(dw2), e.dev(db2)
			if err := kernels.LinearBackwardWeightBias(e.k, ddw2, ddb2, e.dev(dy), e.dev(x), acc); err != nil {
				t.Fatalf("%s backward weight+bias: %v", name, err)
			}
			e.back(dw2, ddw2)
			e.back(db2, ddb2)
			compare(t, name+fmt.Sprintf("_backward_weight_bias_acc%v_dw", acc), dt, dw2, want2, mag2, m)
			compare(t, name+fmt.Sprintf("_backward_weight_bias_acc%v_db", acc), dt, db2, wantb2, magb2, m)
		}
	}
}

func testMatmul(e *env, dt tensor.DType) {
	t := e.t
	rng := rand.New(rand.NewPCG(5, uint64(dt)))
	for _, s := range [][4]int{{1, 1, 1, 1}, {3, 9, 17, 5}, {2, 1, 49, 33}, {4, 25, 8, 1}, {2, 0, 3, 4}, {2, 3, 0, 4}, {2, 3, 4, 0}, {0, 3, 4, 5}} {
		B, M, N, K := s[0], s[1], s[2], s[3]
		name := fmt.Sprintf("B%d_M%d_N%d_K%d", B, M, N, K)
		a := newBuf(rng, dt, "rand", B, M, K)
		b := newBuf(rng, dt, "rand", B, K, N)
		dc := newBuf(rng, dt, "rand", B, M, N)
		bmm := func(rows, cols, inner int, f func(bi, i, j, k int) (float64, float64)) ([]float64, []float64) {
			want, mag := make([]float64, B*rows*cols), make([]float64, B*rows*cols)
			for bi := 0; bi < B; bi++ {
				for i := 0; i < rows; i++ {
					for j := 0; j < cols; j++ {
						o := (bi*rows+i)*cols + j
						for k := 0; k < inner; k++ {
							p, q := f(bi, i, j, k)
							want[o] += p * q
							mag[o] += math.Abs(p * q)
						}
					}
				}
			}
			return want, mag
		}
		c := newBuf(rng, dt, "nan", B, M, N)
		want, mag := bmm(M, N, K, func(bi, i, j, k int) (float64, float64) {
			return a.all[(bi*M+i)*K+k], b.all[(bi*K+k)*N+j]
		})
		dcv := e.dev(c)
		if err := kernels.MatmulForward(e.k, dcv, e.dev(a), e.dev(b)); err != nil {
			t.Fatalf("%s forward: %v", name, err)
		}
		e.back(c, dcv)
		compare(t, name+"_forward", dt, c, want, mag, K)
		for _, acc := range []bool{false, true} {
			fill := "nan"
			if acc {
				fill = "rand"
			}
			da := newBuf(rng, dt, fill, B, M, K)
			db := newBuf(rng, dt, fill, B, K, N)
			wantA, magA := bmm(M, K, N, func(bi, i, j, k int) (float64, float64) {
				return dc.all[(bi*M+i)*N+k], b.all[(bi*K+j)*N+k]
			})
			wantB, magB := bmm(K, N, M, func(bi, i, j, k int) (float64, float64) {
				return a.all[(bi*M+k)*K+i], dc.all[(bi*M+k)*N+j]
			})
			if acc {
				for i := range wantA {
					wantA[i] += da.all[i]
					magA[i] += math.Abs(da.all[i])
				}
				for i := range wantB {
					wantB[i] += db.all[i]
					magB[i] += math.Abs(db.all[i])
				}
			}
			dda, ddb := e.dev(da), e.dev(db)
			if err := kernels.MatmulBackwardInput(e.k, dda, e.dev(dc), e.dev(b), acc); err != nil {
				t.Fatalf("%s backward input: %v", name, err)
			}
			if err := kernels.MatmulBackwardOther(e.k, ddb, e.dev(dc), e.dev(a), acc); err != nil {
				t.Fatalf("%s backward other: %v", name, err)
			}
			e.back(da, dda)
			e.back(db, ddb)
			compare(t, name+fmt.Sprintf("_backward_input_acc%v", acc), dt, da, wantA, magA, N)
			compare(t, name+fmt.Sprintf("_backward_other_acc%v", acc), dt, db, wantB, magB, M)
		}
	}
}

func testGelu(e *env, dt tensor.DType) {
	t := e.t
	rng := rand.New(rand.NewPCG(6, uint64(dt)))
	for _, n := range []int{0, 1, 15, 16, 17, 1000} {
		x := newBuf(rng, dt, "rand", n)
		for i := range x.all { // spread over [-8, 8]
			x.all[i] *= 8
			setAt(x.t, i, x.all[i])
		}
		x.all = append([]float64(nil), x.all...)
		for i := range x.all {
			x.all[i] = x.t.At(i)
		}
		dy := newBuf(rng, dt, "rand", n)
		y := newBuf(rng, dt, "nan", n)
		dx := newBuf(rng, dt, "nan", n)
		want, mag := make([]float64, n), make([]float64, n)
		wantd, magd := make([]float64, n), make([]float64, n)
		for i, v := range x.all {
			want[i], mag[i] = kernels.Gelu(v), math.Abs(v)+1
			wantd[i], magd[i] = dy.all[i]*kernels.GeluGrad(v), math.Abs(dy.all[i])*(1+math.Abs(v))
		}
		yd, dxd := e.dev(y), e.dev(dx)
		if err := e.k.GeluForward(yd, e.dev(x)); err != nil {
			t.Fatal(err)
		}
		if err := e.k.GeluBackward(dxd, e.dev(dy), e.dev(x)); err != nil {
			t.Fatal(err)
		}
		e.back(y, yd)
		e.back(dx, dxd)
		// Elementwise results may use their own tanh: allow a few ulps of float32.
		compare(t, fmt.Sprintf("forward_%d", n), dt, y, want, mag, 20)
		compare(t, fmt.Sprintf("backward_%d", n), dt, dx, wantd, magd, 20)
	}
	testGeluTorch(e, dt, rng)
}

// testGeluTorch runs GELU at PyTorch's points (Torch().Gelu: exact in every
// dtype) against PyTorch's values, not against kernels.Gelu, which the cpu
// provider's float64 path computes with: a wrong constant there would agree
// with itself.
func testGeluTorch(e *env, dt tensor.DType, rng *rand.Rand) {
	g := Torch().Gelu
	n := len(g.X)
	x := newBuf(rng, dt, "rand", n)
	for i, v := range g.X {
		x.all[i] = v
		setAt(x.t, i, v)
		if x.t.At(i) != v {
			e.t.Fatalf("PyTorch's GELU point %v is not exact in %v", v, dt)
		}
	}
	dy := newBuf(rng, dt, "rand", n)
	y, dx := newBuf(rng, dt, "nan", n), newBuf(rng, dt, "nan", n)
	want, mag := make([]float64, n), make([]float64, n)
	wantd, magd := make([]float64, n), make([]float64, n)
	for i, v := range g.X {
		want[i], mag[i] = g.Y[i], math.Abs(v)+1
		wantd[i], magd[i] = dy.all[i]*g.DYDX[i], math.Abs(dy.all[i])*(1+math.Abs(v))
	}
	yd, dxd := e.dev(y), e.dev(dx)
	if err := e.k.GeluForward(yd, e.dev(x)); err != nil {
		e.t.Fatal(err)
	}
	if err := e.k.GeluBackward(dxd, e.dev(dy), e.dev(x)); err != nil {
		e.t.Fatal(err)
	}
	e.back(y, yd)
	e.back(dx, dxd)
	compare(e.t, "forward_pytorch", dt, y, want, mag, 20)
	compare(e.t, "backward_pytorch", dt, dx, wantd, magd, 20)
}

func testErrors(e *env, dt tensor.DType) {
	t := e.t
	rng := rand.New(rand.NewPCG(7, 0))
	x := e.dev(newBuf(rng, dt, "rand", 3, 4))
	w := e.dev(newBuf(rng, dt, "rand", 5, 4))
	y := e.dev(newBuf(rng, dt, "rand", 3, 6))
	if err := kernels.LinearForward(e.k, y, x, w, nil); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("linear with wrong output shape: %v, want ErrShape", err)
	}
	other := tensor.Float64
	if dt == tensor.Float64 {
		other = tensor.Float32
	}
	y2 := e.dev(newBuf(rng, other, "rand", 3, 5))
	if err := kernels.LinearForward(e.k, y2, x, w, nil); !errors.Is(err, kernels.ErrDType) {
		t.Errorf("linear with mixed dtypes: %v, want ErrDType", err)
	}
	p := kernels.GemmParams{M: 3, N: 5, K: 4, Alpha: 1, DType: dt}
	short := e.dev(newBuf(rng, dt, "rand", 14))
	if err := e.k.Gemm(p, kernels.GemmOperands{A: x, B: w, C: short}); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("gemm with short C: %v, want ErrShape", err)
	}
	bias := e.dev(newBuf(rng, dt, "rand", 5))
	if err := e.k.Gemm(p, kernels.GemmOperands{A: x, B: w, C: y, Bias: bias}); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("gemm without epilogue given a bias: %v, want ErrShape", err)
	}
	pb := p
	pb.Epilogue = kernels.EpilogueBiasGelu
	if err := e.k.Gemm(pb, kernels.GemmOperands{A: x, B: w, C: y, Bias: bias}); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("gemm bias+gelu without aux: %v, want ErrShape", err)
	}
	p.LDA = 2
	if err := e.k.Gemm(p, kernels.GemmOperands{A: x, B: w, C: y}); !errors.Is(err, kernels.ErrShape) {
		t.Errorf("gemm with LDA < K: %v, want ErrShape", err)
	}
}

func testDeterminism(t *testing.T, cfg Config, dt tensor.DType) {
	rng := rand.New(rand.NewPCG(8, 0))
	var results [2][]float64
	shapes := []kernels.GemmParams{
		{M: 301, N: 517, K: 300, Alpha: 1, Beta: 0.5},
		{TransB: true, M: 9, N: 1000, K: 600, Alpha: 1},
		{TransA: true, M: 700, N: 97, K: 33, Alpha: 1, Beta: 1},
		{M: 1, N: 4100, K: 300, Alpha: 1},
		{M: 1, N: 700, K: 3000, Alpha: 1, Beta: 0.5},
		{TransB: true, M: 1, N: 2050, K: 300, Alpha: 1},
	}
	if dt == tensor.BFloat16 {
		// K over several cache blocks (float32 sums kept for a bfloat16 C), and
		// the small-M paths.
		shapes = append(shapes, kernels.GemmParams{M: 70, N: 150, K: 4500, Alpha: 1, Beta: 0.5},
			kernels.GemmParams{TransA: true, M: 300, N: 200, K: 7, Alpha: 1, Beta: 1},
			kernels.GemmParams{M: 40, N: 900, K: 1001, Alpha: 1, Beta: 0.5},
			kernels.GemmParams{TransB: true, M: 16, N: 700, K: 4500, Alpha: 1, Beta: 1},
			kernels.GemmParams{TransA: true, M: 100, N: 130, K: 5000, Alpha: 1, Beta: 1})
	}
	var all []kernels.GemmParams
	for _, od := range outs(dt) {
		for _, p := range shapes {
			p.DType = dt
			all = append(all, outParams(p, od))
		}
	}
	for si, p := range all {
		p = p.Normalized()
		la, lb, lc := p.Lens()
		a := newBuf(rng, dt, "rand", la)
		b := newBuf(rng, dt, "rand", lb)
		c0 := newBuf(rng, p.Out(), "rand", lc)
		for i, threads := range []int{1, 2} {
			k, err := cfg.New(threads)
			if err != nil {
				t.Fatal(err)
			}
			c, _ := c0.t.Clone()
			cb := &buf{t: c, size: lc}
			env := &env{t: t, cfg: cfg, k: k}
			dc := env.dev(cb)
			if err := k.Gemm(p, kernels.GemmOperands{A: env.dev(a), B: env.dev(b), C: dc}); err != nil {
				t.Fatal(err)
			}
			env.back(cb, dc)
			results[i] = make([]float64, lc)
			for j := range results[i] {
				results[i][j] = c.At(j)
			}
		}
		for j := range results[0] {
			if math.Float64bits(results[0][j]) != math.Float64bits(results[1][j]) {
				t.Fatalf("shape %d (%v -> %v): element %d differs between 1 and 2 threads: %v vs %v", si, p.DType, p.Out(), j, results[0][j], results[1][j])
			}
		}
	}
}
