package kerneltest

import (
	"math/rand/v2"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// testEmptyTransformer runs every transformer op on empty operands (zero rows,
// zero tokens, zero ids, zero elements), as a rank whose shard is empty runs
// them: no error, nothing written outside the outputs, and the outputs that
// are defined set: gradients that sum over no rows are zero when not
// accumulating and untouched when accumulating, a loss over no tokens is 0.
// (The GEMM-based ops' empty cases are in the Gemm, GemmBatched, Linear,
// Matmul and Epilogues subtests.)
func testEmptyTransformer(e *env, dt tensor.DType) {
	t := e.t
	rng := rand.New(rand.NewPCG(11, uint64(dt)))
	st := kernels.StatsDType(dt)
	const d, heads, width, vocab = 8, 2, 4, 5
	fail := func(op string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s on empty operands: %v", op, err)
		}
	}
	if e.has(kernels.OpLayerNorm) {
		fail("layer_norm", e.k.LayerNorm(e.dev(newBuf(rng, dt, "nan", 0, d)), e.dev(newBuf(rng, st, "nan", 0, 2)),
			e.dev(newBuf(rng, dt, "rand", 0, d)), e.dev(newBuf(rng, dt, "rand", d)), e.dev(newBuf(rng, dt, "rand", d)), 1e-5))
	}
	if e.has(kernels.OpLayerNormBackward) {
		for _, acc := range []bool{false, true} {
			dg, db := newBuf(rng, dt, "rand", d), newBuf(rng, dt, "rand", d)
			want := sumsOfNothing(dg, acc)
			wantb := sumsOfNothing(db, acc)
			ddg, ddb := e.dev(dg), e.dev(db)
			fail("layer_norm_backward", e.k.LayerNormBackward(e.dev(newBuf(rng, dt, "nan", 0, d)), ddg, ddb,
				e.dev(newBuf(rng, dt, "rand", 0, d)), e.dev(newBuf(rng, dt, "rand", 0, d)), e.dev(newBuf(rng, dt, "rand", d)),
				e.dev(newBuf(rng, st, "rand", 0, 2)), acc))
			e.back(dg, ddg)
			e.back(db, ddb)
			compare(t, "layer_norm_backward_empty_dgamma", dt, dg, want, ones(d), 1)
			compare(t, "layer_norm_backward_empty_dbeta", dt, db, wantb, ones(d), 1)
		}
	}
	qkv := func(fill string) *tensor.Tensor { return e.dev(newBuf(rng, dt, fill, 1, 0, heads, width)) }
	if e.has(kernels.OpAttention) {
		fail("attention", e.k.Attention(qkv("nan"), e.dev(newBuf(rng, st, "nan", 1, heads, 0)), qkv("rand"), qkv("rand"), qkv("rand"), true))
	}
	if e.has(kernels.OpAttentionBackward) {
		fail("attention_backward", e.k.AttentionBackward(qkv("nan"), qkv("nan"), qkv("nan"), qkv("rand"), qkv("rand"), qkv("rand"),
			qkv("rand"), qkv("rand"), e.dev(newBuf(rng, st, "rand", 1, heads, 0)), true))
	}
	if e.has(kernels.OpEmbedding) {
		fail("embedding", e.k.Embedding(e.dev(newBuf(rng, dt, "nan", 0, d)), e.dev(newBuf(rng, st, "zero", 0)),
			e.dev(newBuf(rng, dt, "rand", vocab, d)), 0))
	}
	if e.has(kernels.OpEmbeddingBackward) {
		for _, acc := range []bool{false, true} {
			dt0 := newBuf(rng, dt, "rand", vocab, d)
			want := sumsOfNothing(dt0, acc)
			dd := e.dev(dt0)
			fail("embedding_backward", e.k.EmbeddingBackward(dd, e.dev(newBuf(rng, dt, "rand", 0, d)), e.dev(newBuf(rng, st, "zero", 0)), 0, acc))
			e.back(dt0, dd)
			compare(t, "embedding_backward_empty", dt, dt0, want, ones(vocab*d), 1)
		}
	}
	if e.has(kernels.OpCrossEntropy) {
		fail("cross_entropy", e.k.CrossEntropy(e.dev(newBuf(rng, st, "nan", 0, 3)), e.dev(newBuf(rng, dt, "rand", 0, vocab)),
			e.dev(newBuf(rng, st, "zero", 0)), 0))
	}
	if e.has(kernels.OpCrossEntropyBackward) {
		fail("cross_entropy_backward", e.k.CrossEntropyBackward(e.dev(newBuf(rng, dt, "nan", 0, vocab)), e.dev(newBuf(rng, dt, "rand", 0, vocab)),
			e.dev(newBuf(rng, st, "zero", 0)), e.dev(newBuf(rng, st, "rand", 0)), 0, 1))
	}
	if e.has(kernels.OpCrossEntropyCombine) {
		loss := newBuf(rng, tensor.Float64, "nan", 1)
		dl := e.dev(loss)
		fail("cross_entropy_combine", e.k.CrossEntropyCombine(e.dev(newBuf(rng, st, "nan", 0)), dl, e.dev(newBuf(rng, st, "rand", 2, 0, 3))))
		e.back(loss, dl)
		compare(t, "cross_entropy_combine_empty_loss", tensor.Float64, loss, []float64{0}, []float64{1}, 1)
	}
	if e.has(kernels.OpAdamW) && dt == tensor.Float32 {
		v := func() *tensor.Tensor { return e.dev(newBuf(rng, dt, "rand", 0)) }
		fail("adamw", e.k.AdamW(kernels.AdamWParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Step: 1}, v(), v(), v(), v()))
	}
	// The elementwise ops and the bias gradient with no elements.
	z := func(fill string) *tensor.Tensor { return e.dev(newBuf(rng, dt, fill, 0)) }
	fail("gelu_forward", e.k.GeluForward(z("nan"), z("rand")))
	fail("gelu_backward", e.k.GeluBackward(z("nan"), z("rand"), z("rand")))
	fail("axpy", e.k.Axpy(0.5, z("rand"), z("rand")))
	fail("cast", e.k.Cast(z("nan"), z("rand")))
	sum := newBuf(rng, tensor.Float64, "nan", 1)
	ds := e.dev(sum)
	fail("mse", e.k.MSE(z("nan"), ds, z("rand"), z("rand"), 1))
	e.back(sum, ds)
	compare(t, "mse_empty_sum", tensor.Float64, sum, []float64{0}, []float64{1}, 1)
}

// sumsOfNothing is what a gradient summed over no rows must read: zeros, or
// its old values when the op accumulates.
func sumsOfNothing(b *buf, accumulate bool) []float64 {
	want := make([]float64, b.size)
	if accumulate {
		copy(want, b.all)
	}
	return want
}

func ones(n int) []float64 {
	m := make([]float64, n)
	for i := range m {
		m[i] = 1
	}
	return m
}
