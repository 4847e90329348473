package cpu_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	sim "github.com/meshrun/meshrun/placement/placementref"
	"github.com/meshrun/meshrun/spmd/spmdref"
	"github.com/meshrun/meshrun/tensor"
)

func rnd(rng *rand.Rand, shape ...int) *tensor.Tensor {
	t := tensor.New(tensor.Float64, shape...)
	for i := range t.Float64() {
		t.Float64()[i] = rng.Float64()*2 - 1
	}
	return t
}

func zeros(shape ...int) *tensor.Tensor { return tensor.New(tensor.Float64, shape...) }

func simOf(t *tensor.Tensor) sim.Tensor { return sim.Tensor{Shape: t.Shape(), Data: t.Float64()} }

func near(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(got[i] - want[i]); d > tol*max(1, math.Abs(want[i])) || math.IsNaN(got[i]) {
			t.Fatalf("%s[%d] = %.12g, want %.12g", what, i, got[i], want[i])
		}
	}
}

// numGrad is the gradient of Σ w·f(x) with respect to x's values, by
// central differences: the check that does not share the kernels' formulas.
func numGrad(x *tensor.Tensor, w []float64, f func() []float64) []float64 {
	g := make([]float64, x.Len())
	for i := range g {
		v := x.Float64()[i]
		const h = 1e-6
		x.Float64()[i] = v + h
		up := f()
		x.Float64()[i] = v - h
		down := f()
		x.Float64()[i] = v
		for j := range up {
			g[i] += w[j] * (up[j] - down[j]) / (2 * h)
		}
	}
	return g
}

func TestLayerNorm(t *testing.T) {
	p, _ := cpu.New(cpu.Options{})
	rng := rand.New(rand.NewPCG(1, 2))
	x, gamma, beta, dy := rnd(rng, 3, 5, 7), rnd(rng, 7), rnd(rng, 7), rnd(rng, 3, 5, 7)
	y, stats := zeros(3, 5, 7), zeros(15, 2)
	fwd := func() []float64 {
		if err := p.LayerNorm(y, stats, x, gamma, beta, spmdref.LayerNormEps); err != nil {
			t.Fatal(err)
		}
		return append([]float64(nil), y.Float64()...)
	}
	want, err := spmdref.Eval("layernorm", "ABd,d,d->ABd", []sim.Tensor{simOf(x), simOf(gamma), simOf(beta)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "y", fwd(), want.Data, 1e-12)
	dx, dg, db := zeros(3, 5, 7), zeros(7), zeros(7)
	if err := p.LayerNormBackward(dx, dg, db, dy, x, gamma, stats, false); err != nil {
		t.Fatal(err)
	}
	near(t, "dx", dx.Float64(), numGrad(x, dy.Float64(), fwd), 1e-6)
	near(t, "dgamma", dg.Float64(), numGrad(gamma, dy.Float64(), fwd), 1e-6)
	near(t, "dbeta", db.Float64(), numGrad(beta, dy.Float64(), fwd), 1e-6)
	// Accumulate adds; nil outputs are skipped.
	before := append([]float64(nil), dg.Float64()...)
	if err := p.LayerNormBackward(nil, dg, nil, dy, x, gamma, stats, true); err != nil {
		t.Fatal(err)
	}
	for i, v := range dg.Float64() {
		if math.Abs(v-2*before[i]) > 1e-12 {
			t.Fatalf("accumulated dgamma[%d] = %g, want %g", i, v, 2*before[i])
		}
	}
	// No beta: y is the normalized x times gamma, in float64 and, widened,
	// in bfloat16.
	withBeta := fwd()
	if err := p.LayerNorm(y, stats, x, gamma, nil, spmdref.LayerNormEps); err != nil {
		t.Fatal(err)
	}
	for i, v := range y.Float64() {
		if w := withBeta[i] - beta.Float64()[i%7]; math.Abs(v-w) > 1e-12 {
			t.Fatalf("no beta: y[%d] = %g, want %g", i, v, w)
		}
	}
	x16, g16, y16, s16 := tensor.New(tensor.BFloat16, 3, 5, 7), tensor.New(tensor.BFloat16, 7), tensor.New(tensor.BFloat16, 3, 5, 7), tensor.New(tensor.Float32, 15, 2)
	if err := errors.Join(p.Cast(x16, x), p.Cast(g16, gamma), p.LayerNorm(y16, s16, x16, g16, nil, spmdref.LayerNormEps)); err != nil {
		t.Fatalf("bfloat16 without beta: %v", err)
	}
}

func TestAttention(t *testing.T) {
	p, _ := cpu.New(cpu.Options{Threads: 2})
	rng := rand.New(rand.NewPCG(3, 4))
	const b, h, s, e = 2, 3, 6, 4
	f := 5
	q, k, v, do := rnd(rng, b, s, h, e), rnd(rng, b, s, h, e), rnd(rng, b, s, h, f), rnd(rng, b, s, h, f)
	o, lse := zeros(b, s, h, f), zeros(b, h, s)
	fwd := func() []float64 {
		if err := p.Attention(o, lse, q, k, v, true); err != nil {
			t.Fatal(err)
		}
		return append([]float64(nil), o.Float64()...)
	}
	want, err := spmdref.Eval("attention", "Ashe,Athe,Athf->Ashf", []sim.Tensor{simOf(q), simOf(k), simOf(v)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "o", fwd(), want.Data, 1e-12)
	dq, dk, dv := zeros(b, s, h, e), zeros(b, s, h, e), zeros(b, s, h, f)
	if err := p.AttentionBackward(dq, dk, dv, do, q, k, v, o, lse, true); err != nil {
		t.Fatal(err)
	}
	near(t, "dq", dq.Float64(), numGrad(q, do.Float64(), fwd), 1e-6)
	near(t, "dk", dk.Float64(), numGrad(k, do.Float64(), fwd), 1e-6)
	near(t, "dv", dv.Float64(), numGrad(v, do.Float64(), fwd), 1e-6)
	// The first query sees only the first key: its output is v's first row.
	near(t, "o[0,0,0]", o.Float64()[:f], v.Float64()[:f], 1e-12)
	// Heads are independent: a batch split in two gives the same rows.
	o1, lse1 := zeros(1, s, h, f), zeros(1, h, s)
	q1, _ := tensor.FromFloat64(q.Float64()[:s*h*e], 1, s, h, e)
	k1, _ := tensor.FromFloat64(k.Float64()[:s*h*e], 1, s, h, e)
	v1, _ := tensor.FromFloat64(v.Float64()[:s*h*f], 1, s, h, f)
	if err := p.Attention(o1, lse1, q1, k1, v1, true); err != nil {
		t.Fatal(err)
	}
	near(t, "batch 0", o1.Float64(), o.Float64()[:o1.Len()], 0)

	// Packed: qkv[b, s, h, 3, e] gives the same output and gradients.
	if e != f {
		v, do = rnd(rng, b, s, h, e), rnd(rng, b, s, h, e)
		o = zeros(b, s, h, e)
		dv = zeros(b, s, h, e)
		fwd()
		if err := p.AttentionBackward(dq, dk, dv, do, q, k, v, o, lse, true); err != nil {
			t.Fatal(err)
		}
	}
	qkv, dqkv := zeros(b, s, h, 3, e), zeros(b, s, h, 3, e)
	for r := 0; r < b*s*h; r++ {
		for i, x := range []*tensor.Tensor{q, k, v} {
			copy(qkv.Float64()[(r*3+i)*e:], x.Float64()[r*e:(r+1)*e])
		}
	}
	op, lp := zeros(b, s, h, e), zeros(b, h, s)
	if err := p.Attention(op, lp, qkv, nil, nil, true); err != nil {
		t.Fatal(err)
	}
	near(t, "packed o", op.Float64(), o.Float64(), 0)
	if err := p.AttentionBackward(dqkv, nil, nil, do, qkv, nil, nil, op, lp, true); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < b*s*h; r++ {
		for i, g := range []*tensor.Tensor{dq, dk, dv} {
			near(t, "packed grad", dqkv.Float64()[(r*3+i)*e:(r*3+i+1)*e], g.Float64()[r*e:(r+1)*e], 1e-12)
		}
	}
}

func TestEmbedding(t *testing.T) {
	p, _ := cpu.New(cpu.Options{})
	rng := rand.New(rand.NewPCG(5, 6))
	const vocab, d, offset, rows = 11, 4, 3, 5 // this shard holds ids 3..7
	ids := zeros(2, 6)
	for i := range ids.Float64() {
		ids.Float64()[i] = float64(rng.IntN(vocab))
	}
	table, dy := rnd(rng, rows, d), rnd(rng, 2, 6, d)
	y, dt := zeros(2, 6, d), zeros(rows, d)
	if err := p.Embedding(y, ids, table, offset); err != nil {
		t.Fatal(err)
	}
	want, err := spmdref.EvalAt("embedding", "AB,vd->ABd", []sim.Tensor{simOf(ids), simOf(table)}, nil, offset)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "y", y.Float64(), want.Data, 0)
	if err := p.EmbeddingBackward(dt, dy, ids, offset, false); err != nil {
		t.Fatal(err)
	}
	wantD, err := spmdref.EvalAt("embedding.grad_table", "ABd,AB->vd", []sim.Tensor{simOf(dy), simOf(ids)}, []int{rows, d}, offset)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "dtable", dt.Float64(), wantD.Data, 1e-12)
}

// TestCrossEntropy: the stats of two vocabulary shards combine into the
// whole row's loss, and the backward is the loss's gradient.
func TestCrossEntropy(t *testing.T) {
	p, _ := cpu.New(cpu.Options{})
	rng := rand.New(rand.NewPCG(7, 8))
	const rows, vocab, split = 5, 9, 4
	logits := rnd(rng, rows, vocab)
	targets := zeros(rows)
	for i := range targets.Float64() {
		targets.Float64()[i] = float64(rng.IntN(vocab))
	}
	shard := func(lo, hi int) *tensor.Tensor {
		s := zeros(rows, hi-lo)
		for r := 0; r < rows; r++ {
			copy(s.Float64()[r*(hi-lo):], logits.Float64()[r*vocab+lo:r*vocab+hi])
		}
		return s
	}
	loss := func() []float64 {
		var out []float64
		st := [2]*tensor.Tensor{zeros(rows, 3), zeros(rows, 3)}
		for i, r := range [2][2]int{{0, split}, {split, vocab}} {
			if err := p.CrossEntropy(st[i], shard(r[0], r[1]), targets, r[0]); err != nil {
				t.Fatal(err)
			}
		}
		for r := 0; r < rows; r++ {
			a, b := st[0].Float64()[3*r:], st[1].Float64()[3*r:]
			m := max(a[0], b[0])
			lse := m + math.Log(a[1]*math.Exp(a[0]-m)+b[1]*math.Exp(b[0]-m))
			out = append(out, lse-(a[2]+b[2]))
		}
		return out
	}
	got := loss()
	// The kernel's combine of the same two shards' stats.
	gathered, lseC, sum := zeros(2, rows, 3), zeros(rows), zeros(1)
	for i, r := range [2][2]int{{0, split}, {split, vocab}} {
		st := zeros(rows, 3)
		if err := p.CrossEntropy(st, shard(r[0], r[1]), targets, r[0]); err != nil {
			t.Fatal(err)
		}
		copy(gathered.Float64()[i*rows*3:], st.Float64())
	}
	if err := p.CrossEntropyCombine(lseC, sum, gathered); err != nil {
		t.Fatal(err)
	}
	var total float64
	for _, l := range got {
		total += l
	}
	near(t, "combined loss", sum.Float64(), []float64{total}, 1e-12)
	for r := 0; r < rows; r++ {
		row := logits.Float64()[r*vocab : (r+1)*vocab]
		var z float64
		for _, x := range row {
			z += math.Exp(x)
		}
		want := math.Log(z) - row[int(targets.Float64()[r])]
		near(t, "loss", got[r:r+1], []float64{want}, 1e-12)
	}
	// The gradient of the mean loss, on the whole row (one shard, offset 0).
	lse, st := zeros(rows), zeros(rows, 3)
	if err := p.CrossEntropy(st, logits, targets, 0); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < rows; r++ {
		lse.Float64()[r] = st.Float64()[3*r] + math.Log(st.Float64()[3*r+1])
	}
	dl := zeros(rows, vocab)
	if err := p.CrossEntropyBackward(dl, logits, targets, lse, 0, 1.0/rows); err != nil {
		t.Fatal(err)
	}
	w := make([]float64, rows)
	for i := range w {
		w[i] = 1.0 / rows
	}
	near(t, "dlogits", dl.Float64(), numGrad(logits, w, loss), 1e-6)
}

// TestAdamW: two steps against the update written out in float64.
func TestAdamW(t *testing.T) {
	p, _ := cpu.New(cpu.Options{})
	a := kernels.AdamWParams{LR: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1}
	param := []float32{0.5, -1, 2, 0}
	grads := [][]float32{{0.1, -0.2, 0.3, 0}, {-0.1, 0.05, 0.3, 1}}
	pt, _ := tensor.FromFloat32(append([]float32(nil), param...), 4)
	m, v := tensor.New(tensor.Float32, 4), tensor.New(tensor.Float32, 4)
	want := make([]float64, 4)
	mw, vw := make([]float64, 4), make([]float64, 4)
	for i := range want {
		want[i] = float64(param[i])
	}
	for step, g := range grads {
		a.Step = step + 1
		gt, _ := tensor.FromFloat32(g, 4)
		if err := p.AdamW(a, pt, gt, m, v); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			gi := float64(g[i])
			want[i] *= 1 - a.LR*a.WeightDecay
			mw[i] = a.Beta1*mw[i] + (1-a.Beta1)*gi
			vw[i] = a.Beta2*vw[i] + (1-a.Beta2)*gi*gi
			mh := mw[i] / (1 - math.Pow(a.Beta1, float64(a.Step)))
			vh := vw[i] / (1 - math.Pow(a.Beta2, float64(a.Step)))
			want[i] -= a.LR * mh / (math.Sqrt(vh) + a.Eps)
		}
	}
	got := make([]float64, 4)
	for i, x := range pt.Float32() {
		got[i] = float64(x)
	}
	near(t, "param", got, want, 1e-6)
	a.Step = 0
	if err := p.AdamW(a, pt, pt, m, v); err == nil {
		t.Fatal("step 0 accepted")
	}
}

// TestTransformerFloat32: float32 runs agree with float64 to float32's
// precision, and bad shapes are refused before any work.
func TestTransformerFloat32(t *testing.T) {
	p, _ := cpu.New(cpu.Options{})
	rng := rand.New(rand.NewPCG(9, 10))
	q, k, v := rnd(rng, 8, 4, 16), rnd(rng, 8, 4, 16), rnd(rng, 8, 4, 16)
	o, lse := zeros(8, 4, 16), zeros(4, 8)
	if err := p.Attention(o, lse, q, k, v, true); err != nil {
		t.Fatal(err)
	}
	c := func(x *tensor.Tensor) *tensor.Tensor {
		y := tensor.New(tensor.Float32, x.Shape()...)
		if err := p.Cast(y, x); err != nil {
			t.Fatal(err)
		}
		return y
	}
	o32, lse32 := tensor.New(tensor.Float32, 8, 4, 16), tensor.New(tensor.Float32, 4, 8)
	if err := p.Attention(o32, lse32, c(q), c(k), c(v), true); err != nil {
		t.Fatal(err)
	}
	got := make([]float64, o32.Len())
	for i, x := range o32.Float32() {
		got[i] = float64(x)
	}
	near(t, "float32 o", got, o.Float64(), 1e-5)
	if err := p.Attention(zeros(8, 4, 15), lse, q, k, v, true); err == nil {
		t.Fatal("attention into a wrong shape accepted")
	}
	if err := p.LayerNorm(zeros(2, 3), zeros(2, 2), zeros(2, 3), zeros(4), zeros(4), 1e-5); err == nil {
		t.Fatal("layernorm with a wrong gamma accepted")
	}
	if err := p.Embedding(zeros(2, 3), zeros(2), tensor.New(tensor.Float32, 5, 3), 0); err == nil {
		t.Fatal("embedding across dtypes accepted")
	}
}

// TestTransformerBFloat16: bfloat16 data computes in float32 and rounds
// once: every op within bfloat16's rounding of the float32 result, with
// float32 statistics and ids; bfloat16 statistics are refused.
func TestTransformerBFloat16(t *testing.T) {
	p, _ := cpu.New(cpu.Options{})
	rng := rand.New(rand.NewPCG(11, 12))
	as := func(dt tensor.DType, x *tensor.Tensor) *tensor.Tensor {
		y := tensor.New(dt, x.Shape()...)
		if err := p.Cast(y, x); err != nil {
			t.Fatal(err)
		}
		return y
	}
	close := func(what string, got, want *tensor.Tensor) {
		t.Helper()
		g, w := as(tensor.Float64, got).Float64(), as(tensor.Float64, want).Float64()
		for i := range g {
			if d := math.Abs(g[i] - w[i]); d > 2e-2*max(1, math.Abs(w[i])) {
				t.Fatalf("%s[%d] = %g in bfloat16, %g in float32", what, i, g[i], w[i])
			}
		}
	}
	b16, f32 := tensor.BFloat16, tensor.Float32
	// Layer norm, forward and backward.
	x, gamma, beta, dy := rnd(rng, 6, 8), rnd(rng, 8), rnd(rng, 8), rnd(rng, 6, 8)
	y32, st32 := tensor.New(f32, 6, 8), tensor.New(f32, 6, 2)
	if err := p.LayerNorm(y32, st32, as(f32, x), as(f32, gamma), as(f32, beta), 1e-5); err != nil {
		t.Fatal(err)
	}
	y16, st16 := tensor.New(b16, 6, 8), tensor.New(f32, 6, 2)
	if err := p.LayerNorm(y16, st16, as(b16, x), as(b16, gamma), as(b16, beta), 1e-5); err != nil {
		t.Fatal(err)
	}
	close("layernorm y", y16, y32)
	dx16, dg16 := tensor.New(b16, 6, 8), tensor.New(b16, 8)
	if err := p.LayerNormBackward(dx16, dg16, nil, as(b16, dy), as(b16, x), as(b16, gamma), st16, false); err != nil {
		t.Fatal(err)
	}
	dx32, dg32 := tensor.New(f32, 6, 8), tensor.New(f32, 8)
	if err := p.LayerNormBackward(dx32, dg32, nil, as(f32, dy), as(f32, x), as(f32, gamma), st32, false); err != nil {
		t.Fatal(err)
	}
	close("layernorm dx", dx16, dx32)
	close("layernorm dgamma", dg16, dg32)
	// Packed attention, forward and backward.
	qkv, do := rnd(rng, 2, 5, 2, 3, 4), rnd(rng, 2, 5, 2, 4)
	o32, l32 := tensor.New(f32, 2, 5, 2, 4), tensor.New(f32, 2, 2, 5)
	o16, l16 := tensor.New(b16, 2, 5, 2, 4), tensor.New(f32, 2, 2, 5)
	if err := p.Attention(o32, l32, as(f32, qkv), nil, nil, true); err != nil {
		t.Fatal(err)
	}
	if err := p.Attention(o16, l16, as(b16, qkv), nil, nil, true); err != nil {
		t.Fatal(err)
	}
	close("attention o", o16, o32)
	g32, g16 := tensor.New(f32, 2, 5, 2, 3, 4), tensor.New(b16, 2, 5, 2, 3, 4)
	if err := p.AttentionBackward(g32, nil, nil, as(f32, do), as(f32, qkv), nil, nil, o32, l32, true); err != nil {
		t.Fatal(err)
	}
	if err := p.AttentionBackward(g16, nil, nil, as(b16, do), as(b16, qkv), nil, nil, o16, l16, true); err != nil {
		t.Fatal(err)
	}
	close("attention dqkv", g16, g32)
	// Embedding and cross-entropy: ids and targets, statistics in float32.
	ids := tensor.New(f32, 7)
	for i := range ids.Float32() {
		ids.Float32()[i] = float32(rng.IntN(9))
	}
	table := rnd(rng, 9, 4)
	e32, e16 := tensor.New(f32, 7, 4), tensor.New(b16, 7, 4)
	if err := p.Embedding(e32, ids, as(f32, table), 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Embedding(e16, ids, as(b16, table), 0); err != nil {
		t.Fatal(err)
	}
	close("embedding", e16, e32)
	logits := rnd(rng, 7, 9)
	c32, c16 := tensor.New(f32, 7, 3), tensor.New(f32, 7, 3)
	if err := p.CrossEntropy(c32, as(f32, logits), ids, 0); err != nil {
		t.Fatal(err)
	}
	if err := p.CrossEntropy(c16, as(b16, logits), ids, 0); err != nil {
		t.Fatal(err)
	}
	close("cross-entropy stats", c16, c32)
	if err := p.LayerNorm(y16, tensor.New(b16, 6, 2), as(b16, x), as(b16, gamma), as(b16, beta), 1e-5); err == nil {
		t.Fatal("bfloat16 layer norm statistics accepted")
	}
}
