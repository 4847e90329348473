//go:build cudaemu

package ptx

import (
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// of makes a tensor of dtype dt from values.
func of(dt tensor.DType, x []float64, shape ...int) *tensor.Tensor {
	h, _ := tensor.FromFloat64(x, shape...)
	t, err := tensor.Convert(h, dt)
	if err != nil {
		panic(err)
	}
	return t
}

func randn(rng *rand.Rand, dt tensor.DType, scale float64, shape ...int) *tensor.Tensor {
	x := make([]float64, tensor.NumElements(shape))
	for i := range x {
		x[i] = rng.NormFloat64() * scale
	}
	return of(dt, x, shape...)
}

func clone(t *tensor.Tensor) *tensor.Tensor {
	if t == nil {
		return nil
	}
	c, _ := t.Clone()
	return c
}

// same compares element by element within tol, relative to values of order 1.
func same(t *testing.T, what string, got, want *tensor.Tensor, tol float64) {
	t.Helper()
	if got.Len() != want.Len() {
		t.Fatalf("%s: %d elements, want %d", what, got.Len(), want.Len())
	}
	for i := range got.Len() {
		g, w := got.At(i), want.At(i)
		if math.Abs(g-w) > tol*math.Max(1, math.Abs(w)) {
			t.Fatalf("%s [%d of %d]: %g, cpu provider %g", what, i, got.Len(), g, w)
		}
	}
}

func tolOf(dt tensor.DType) float64 {
	if dt == tensor.BFloat16 {
		return tensor.BF16Epsilon
	}
	return 2e-6
}

// TestLayerNormBlocksMatchCPU: the layer norm's block kernels (a block
// per row, its threads together at its barriers) against the cpu
// provider, float32 and bfloat16, rows narrower than the block and wider
// (700 columns: most threads take three), with beta and without.
func TestLayerNormBlocksMatchCPU(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	p := cpuP(t)
	st := kernels.StatsDType(tensor.BFloat16)
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		tol := tolOf(dt)
		for _, rd := range [][2]int{{1, 1}, {5, 7}, {9, 64}, {3, 700}} {
			rows, d := rd[0], rd[1]
			x, gamma, beta := randn(rng, dt, 2, rows, d), randn(rng, dt, 1, d), randn(rng, dt, 1, d)
			if rows == 5 {
				beta = nil // none: y = x̂·gamma
			}
			y, stats := tensor.New(dt, rows, d), tensor.New(st, rows, 2)
			wy, wstats := tensor.New(dt, rows, d), tensor.New(st, rows, 2)
			LayerNormBlock(y, stats, x, gamma, beta, rows, d, 1e-5)
			if err := p.LayerNorm(wy, wstats, x, gamma, beta, 1e-5); err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("%v %dx%d beta=%v", dt, rows, d, beta != nil)
			same(t, name+" layernorm y", y, wy, tol)
			same(t, name+" layernorm stats", stats, wstats, 2e-6)
			dy, dx, wdx := randn(rng, dt, 1, rows, d), tensor.New(dt, rows, d), tensor.New(dt, rows, d)
			LayerNormDXBlock(dx, dy, x, gamma, wstats, rows, d)
			if err := p.LayerNormBackward(wdx, nil, nil, dy, x, gamma, wstats, false); err != nil {
				t.Fatal(err)
			}
			same(t, name+" layernorm dx", dx, wdx, 4*tol)
		}
	}
}

// TestTransformerKernelsMatchCPU: the transformer's kernels (layer norm
// forward and backward, embedding and its gradient, cross-entropy, its
// gradient and the shards' combination, AdamW) run on the CPU thread by
// thread against the cpu provider, float32 and bfloat16, at sizes 0, 1 and
// odd, with ids and targets inside and outside the shard.
func TestTransformerKernelsMatchCPU(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	p := cpuP(t)
	st := kernels.StatsDType(tensor.BFloat16)
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		tol := tolOf(dt)
		for _, rd := range [][2]int{{0, 4}, {1, 1}, {5, 7}, {9, 64}} {
			rows, d := rd[0], rd[1]
			for _, run := range [][3]int{{3, 3, 2}, {256, 64, 64}} { // threads, columns per segment, rows per chunk
				threads, seg, chunk := run[0], run[1], run[2]
				x, gamma, beta := randn(rng, dt, 2, rows, d), randn(rng, dt, 1, d), randn(rng, dt, 1, d)
				y, stats := tensor.New(dt, rows, d), tensor.New(st, rows, 2)
				wy, wstats := tensor.New(dt, rows, d), tensor.New(st, rows, 2)
				LayerNorm(y, stats, x, gamma, beta, rows, d, 1e-5, seg, threads)
				if err := p.LayerNorm(wy, wstats, x, gamma, beta, 1e-5); err != nil {
					t.Fatal(err)
				}
				same(t, "layernorm y", y, wy, tol)
				same(t, "layernorm stats", stats, wstats, 2e-6)

				dy := randn(rng, dt, 1, rows, d)
				for _, accumulate := range []bool{false, true} {
					dx, dg, db := tensor.New(dt, rows, d), randn(rng, dt, 1, d), randn(rng, dt, 1, d)
					wdx, wdg, wdb := tensor.New(dt, rows, d), clone(dg), clone(db)
					LayerNormBackward(dx, dg, db, dy, x, gamma, wstats, rows, d, accumulate, seg, chunk, threads)
					if err := p.LayerNormBackward(wdx, wdg, wdb, dy, x, gamma, wstats, accumulate); err != nil {
						t.Fatal(err)
					}
					same(t, "layernorm dx", dx, wdx, 4*tol)
					same(t, "layernorm dgamma", dg, wdg, 4*tol)
					same(t, "layernorm dbeta", db, wdb, 4*tol)
				}
			}
		}

		// Embedding: a shard of 10 rows from 5; ids inside and outside.
		const offset, vrows, dim = 5, 10, 6
		ids := of(st, []float64{5, 14, 4, 15, 9, 9, 0, 7, 5, 20, 12, 13, 6}, 13)
		table := randn(rng, dt, 1, vrows, dim)
		for _, threads := range []int{4, 256} {
			y, wy := tensor.New(dt, 13, dim), tensor.New(dt, 13, dim)
			Embedding(y, ids, table, offset, vrows, dim, 13, threads)
			if err := p.Embedding(wy, ids, table, offset); err != nil {
				t.Fatal(err)
			}
			same(t, "embedding", y, wy, 0)
			dy := randn(rng, dt, 1, 13, dim)
			for _, accumulate := range []bool{false, true} {
				dtable := randn(rng, dt, 1, vrows, dim)
				want := clone(dtable)
				if err := p.EmbeddingBackward(want, dy, ids, offset, accumulate); err != nil {
					t.Fatal(err)
				}
				// As the provider runs it: a float32 table, zeroed or widened,
				// then narrowed.
				// One thread per column, and in stages over chunks of 1,
				// 4 and all 13 tokens.
				for _, chunk := range []int{0, 1, 4, 13} {
					acc := tensor.New(tensor.Float32, vrows, dim)
					if accumulate {
						p.Cast(acc, dtable)
					}
					EmbeddingGrad(acc, dy, ids, offset, vrows, dim, 13, chunk, threads)
					got := tensor.New(dt, vrows, dim)
					p.Cast(got, acc)
					same(t, fmt.Sprintf("embedding grad, chunks of %d", chunk), got, want, tol)
				}
			}
		}

		// Cross-entropy over two vocabulary shards of 11 and 7.
		const rowsT = 6
		targets := of(st, []float64{0, 3, 10, 11, 17, 2}, rowsT)
		var parts []*tensor.Tensor
		var logits []*tensor.Tensor
		for _, sh := range [][2]int{{0, 11}, {11, 7}} {
			off, v := sh[0], sh[1]
			l := randn(rng, dt, 3, rowsT, v)
			logits = append(logits, l)
			stats, want := tensor.New(st, rowsT, 3), tensor.New(st, rowsT, 3)
			CrossEntropy(stats, l, targets, off, v, rowsT, 5)
			if err := p.CrossEntropy(want, l, targets, off); err != nil {
				t.Fatal(err)
			}
			same(t, "cross entropy stats", stats, want, 2e-6)
			parts = append(parts, want)
		}
		all := make([]float64, 0, 2*rowsT*3)
		for _, s := range parts {
			for i := range s.Len() {
				all = append(all, s.At(i))
			}
		}
		stats := of(st, all, 2, rowsT, 3)
		lse, wlse, wloss := tensor.New(st, rowsT), tensor.New(st, rowsT), tensor.New(tensor.Float64, 1)
		loss := CrossEntropyCombine(lse, stats, 2, rowsT, 4)
		if err := p.CrossEntropyCombine(wlse, wloss, stats); err != nil {
			t.Fatal(err)
		}
		same(t, "cross entropy lse", lse, wlse, 2e-6)
		if w := wloss.Float64()[0]; math.Abs(loss-w) > 1e-12*math.Abs(w) {
			t.Fatalf("cross entropy loss %v: %.17g, cpu provider %.17g", dt, loss, w)
		}
		for i, sh := range [][2]int{{0, 11}, {11, 7}} {
			dl, want := tensor.New(dt, rowsT, sh[1]), tensor.New(dt, rowsT, sh[1])
			CrossEntropyBackward(dl, logits[i], targets, wlse, sh[0], sh[1], rowsT, 1.0/rowsT, 7)
			if err := p.CrossEntropyBackward(want, logits[i], targets, wlse, sh[0], 1.0/rowsT); err != nil {
				t.Fatal(err)
			}
			same(t, "cross entropy grad", dl, want, tol)
		}
	}

	// AdamW, three steps, on float32.
	param, m, v := randn(rng, tensor.Float32, 1, 1001), tensor.New(tensor.Float32, 1001), tensor.New(tensor.Float32, 1001)
	wp, wm, wv := clone(param), clone(m), clone(v)
	for step := 1; step <= 3; step++ {
		a := kernels.AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: step}
		grad := randn(rng, tensor.Float32, 1, 1001)
		AdamW(a, param, grad, m, v, 33)
		if err := p.AdamW(a, wp, grad, wm, wv); err != nil {
			t.Fatal(err)
		}
	}
	same(t, "adamw param", param, wp, 1e-6)
	same(t, "adamw m", m, wm, 1e-6)
	same(t, "adamw v", v, wv, 1e-6)
}
