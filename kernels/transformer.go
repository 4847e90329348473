package kernels

import (
	"fmt"
	"math"

	"github.com/meshrun/meshrun/tensor"
)

// TransformerKernels are the ops of a transformer block beyond its GEMMs, as
// each rank runs them on its shards: float32, float64 and bfloat16 data
// (bfloat16 computed in float32 and rounded once, the statistics, ids and
// targets in float32: StatsDType), AdamW on float32:
//
//	LayerNorm          y = (x − mean)·rstd·gamma + beta over the last dim of
//	                   x[..., D]; stats[rows, 2] receives (mean, rstd), rstd =
//	                   1/√(var + eps), for the backward; beta may be nil
//	                   (none)
//	LayerNormBackward  dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·gamma;
//	                   dgamma (+)= Σ_rows dy·x̂, dbeta (+)= Σ_rows dy; any of
//	                   dx, dgamma, dbeta may be nil (not needed)
//	Attention          o = softmax(q·kᵀ/√E, causal: key t ≤ query s)·v per
//	                   batch and head: q[..., S, H, E], k[..., T, H, E],
//	                   v[..., T, H, F], o[..., S, H, F] (tokens, then heads:
//	                   the layout of the projections, no transposes);
//	                   lse[..., H, S] receives each row's log-sum-exp. With
//	                   k and v nil, q is packed: qkv[..., S, H, 3, E], per
//	                   head its query, key and value (Megatron's fused QKV
//	                   projection), and the backward's dq is dqkv
//	AttentionBackward  dq, dk, dv from do, q, k, v, o and lse (recomputing
//	                   the probabilities; nothing S×T is kept between passes)
//	Embedding          y[..., D] = table[id − offset] for ids[...] (integers
//	                   held as floats) within the table's rows [offset,
//	                   offset + V), zeros elsewhere: a rank's vocabulary
//	                   shard
//	EmbeddingBackward  dtable[id − offset] (+)= dy[...] for the ids in range
//	CrossEntropy       per row of logits[T, V] (a vocabulary shard from
//	                   offset): stats[T, 3] = (max, Σ exp(l − max), the
//	                   target's logit or 0 when another shard holds it)
//	CrossEntropyCombine  lse[T] and loss[0] (float64) = Σ_t (lse − target
//	                   logit) from the stats of every shard, gathered as
//	                   stats[P, T, 3]
//	CrossEntropyBackward dlogits = scale·(exp(l − lse) − [v = target]) with
//	                   lse[T] the rows' log-sum-exp over the whole vocabulary
//	AdamW              PyTorch's AdamW step on float32 param, grad, and the
//	                   moments m and v
//
// (+)= as in Kernels: accumulate adds, otherwise the output is overwritten.
type TransformerKernels interface {
	LayerNorm(y, stats, x, gamma, beta *tensor.Tensor, eps float64) error
	LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats *tensor.Tensor, accumulate bool) error
	Attention(o, lse, q, k, v *tensor.Tensor, causal bool) error
	AttentionBackward(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool) error
	Embedding(y, ids, table *tensor.Tensor, offset int) error
	EmbeddingBackward(dtable, dy, ids *tensor.Tensor, offset int, accumulate bool) error
	CrossEntropy(stats, logits, targets *tensor.Tensor, offset int) error
	CrossEntropyBackward(dlogits, logits, targets, lse *tensor.Tensor, offset int, scale float64) error
	CrossEntropyCombine(lse, loss, stats *tensor.Tensor) error
	AdamW(p AdamWParams, param, grad, m, v *tensor.Tensor) error
}

// AdamWParams is one AdamW step: Step counts from 1.
type AdamWParams struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
	Step                               int
}

// LayerNormDims checks LayerNorm's operands and returns (rows, D).
func LayerNormDims(y, stats, x, gamma, beta *tensor.Tensor) (rows, d int, err error) {
	if x.Rank() < 1 || !tensor.SameShape(x, y) || gamma.Rank() != 1 || gamma.Dim(0) != x.Dim(-1) ||
		(beta != nil && !tensor.SameShape(beta, gamma)) || stats.Len() != 2*lead(x) {
		return 0, 0, fmt.Errorf("%w: layernorm y=%v stats=%v x=%v gamma=%v beta=%v", ErrShape, y, stats, x, gamma, beta)
	}
	data := []*tensor.Tensor{x, y, gamma}
	if beta != nil {
		data = append(data, beta)
	}
	return lead(x), x.Dim(-1), dtypes(data, stats)
}

// CrossEntropyBackwardDims checks CrossEntropyBackward's operands (lse [T],
// dlogits like logits) and returns (T, V).
func CrossEntropyBackwardDims(dlogits, logits, targets, lse *tensor.Tensor) (t, v int, err error) {
	if t, v, err = CrossEntropyDims(lse, logits, targets, 1); err != nil {
		return 0, 0, err
	}
	if _, err := ElementwiseDims(dlogits, logits); err != nil {
		return 0, 0, err
	}
	return t, v, nil
}

// LayerNormBackwardDims checks LayerNormBackward's operands (dx, dgamma and
// dbeta may be nil) and returns (rows, D).
func LayerNormBackwardDims(dx, dgamma, dbeta, dy, x, gamma, stats *tensor.Tensor) (rows, d int, err error) {
	rows, d, err = LayerNormDims(dy, stats, x, gamma, nil)
	if err != nil {
		return 0, 0, err
	}
	for _, t := range []*tensor.Tensor{dx, dgamma, dbeta} {
		if t != nil && t.DType() != x.DType() {
			return 0, 0, fmt.Errorf("%w: layernorm backward: a %v gradient of %v", ErrDType, t.DType(), x.DType())
		}
	}
	if dx != nil && !tensor.SameShape(dx, x) || dgamma != nil && !tensor.SameShape(dgamma, gamma) || dbeta != nil && !tensor.SameShape(dbeta, gamma) {
		return 0, 0, fmt.Errorf("%w: layernorm backward dx=%v dgamma=%v dbeta=%v for x=%v gamma=%v", ErrShape, dx, dgamma, dbeta, x, gamma)
	}
	return rows, d, nil
}

// AttentionDims checks Attention's operands and returns (batch, heads, S,
// T, E, F): q[..., S, H, E], k[..., T, H, E], v[..., T, H, F], o[..., S, H,
// F], lse[..., H, S]; batch is the product of the leading dims.
func AttentionDims(o, lse, q, k, v *tensor.Tensor) (b, h, s, t, e, f int, err error) {
	if k == nil && v == nil {
		return packedDims(o, lse, q)
	}
	if k == nil || v == nil {
		return 0, 0, 0, 0, 0, 0, fmt.Errorf("%w: attention with k=%v v=%v: both or neither (q packed)", ErrShape, k, v)
	}
	r := q.Rank()
	bad := r < 3 || k.Rank() != r || v.Rank() != r || o.Rank() != r || lse.Rank() != r-1
	if !bad {
		for i := 0; i < r-3; i++ {
			bad = bad || k.Dim(i) != q.Dim(i) || v.Dim(i) != q.Dim(i) || o.Dim(i) != q.Dim(i) || lse.Dim(i) != q.Dim(i)
		}
		s, h, e, t, f = q.Dim(-3), q.Dim(-2), q.Dim(-1), k.Dim(-3), v.Dim(-1)
		bad = bad || k.Dim(-2) != h || k.Dim(-1) != e || v.Dim(-3) != t || v.Dim(-2) != h ||
			o.Dim(-3) != s || o.Dim(-2) != h || o.Dim(-1) != f || lse.Dim(-2) != h || lse.Dim(-1) != s
	}
	if bad {
		return 0, 0, 0, 0, 0, 0, fmt.Errorf("%w: attention o=%v lse=%v q=%v k=%v v=%v", ErrShape, o, lse, q, k, v)
	}
	return q.Len() / max(s*h*e, 1), h, s, t, e, f, dtypes([]*tensor.Tensor{q, k, v, o}, lse)
}

// AttentionBackwardDims checks AttentionBackward's operands (dq, dk, dv
// shaped as q, k, v; dk and dv nil when q is packed) and returns what
// AttentionDims returns.
func AttentionBackwardDims(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor) (b, h, s, t, e, f int, err error) {
	b, h, s, t, e, f, err = AttentionDims(o, lse, q, k, v)
	if err != nil {
		return
	}
	if (dk == nil) != (k == nil) || (dv == nil) != (v == nil) || !tensor.SameShape(dq, q) || !tensor.SameShape(do, o) ||
		k != nil && (!tensor.SameShape(dk, k) || !tensor.SameShape(dv, v)) {
		return 0, 0, 0, 0, 0, 0, fmt.Errorf("%w: attention backward dq=%v dk=%v dv=%v do=%v for q=%v k=%v v=%v", ErrShape, dq, dk, dv, do, q, k, v)
	}
	if _, _, _, _, _, _, err := AttentionDims(do, lse, dq, dk, dv); err != nil {
		return 0, 0, 0, 0, 0, 0, err
	}
	return b, h, s, t, e, f, nil
}

// packedDims checks a packed attention: qkv[..., S, H, 3, E] (per head its
// query, key and value: Megatron's fused projection), o[..., S, H, E].
func packedDims(o, lse, qkv *tensor.Tensor) (b, h, s, t, e, f int, err error) {
	r := qkv.Rank()
	bad := r < 4 || qkv.Dim(-2) != 3 || o.Rank() != r-1 || lse.Rank() != r-2
	if !bad {
		for i := 0; i < r-4; i++ {
			bad = bad || o.Dim(i) != qkv.Dim(i) || lse.Dim(i) != qkv.Dim(i)
		}
		s, h, e = qkv.Dim(-4), qkv.Dim(-3), qkv.Dim(-1)
		bad = bad || o.Dim(-3) != s || o.Dim(-2) != h || o.Dim(-1) != e || lse.Dim(-2) != h || lse.Dim(-1) != s
	}
	if bad {
		return 0, 0, 0, 0, 0, 0, fmt.Errorf("%w: packed attention o=%v lse=%v qkv=%v", ErrShape, o, lse, qkv)
	}
	return qkv.Len() / max(s*h*3*e, 1), h, s, s, e, e, dtypes([]*tensor.Tensor{qkv, o}, lse)
}

// EmbeddingDims checks Embedding's operands and returns (ids, V, D).
func EmbeddingDims(y, ids, table *tensor.Tensor) (n, rows, d int, err error) {
	ok := table.Rank() == 2 && y.Rank() == ids.Rank()+1 && y.Dim(-1) == table.Dim(1)
	for i := 0; ok && i < ids.Rank(); i++ {
		ok = y.Dim(i) == ids.Dim(i)
	}
	if !ok {
		return 0, 0, 0, fmt.Errorf("%w: embedding y=%v ids=%v table=%v", ErrShape, y, ids, table)
	}
	return ids.Len(), table.Dim(0), table.Dim(1), dtypes([]*tensor.Tensor{y, table}, ids)
}

// CrossEntropyDims checks CrossEntropy's operands (stats [T, 3], or lse [T]
// for the backward) and returns (T, V).
func CrossEntropyDims(stats, logits, targets *tensor.Tensor, width int) (t, v int, err error) {
	if logits.Rank() != 2 || targets.Rank() != 1 || targets.Dim(0) != logits.Dim(0) || stats.Len() != width*logits.Dim(0) {
		return 0, 0, fmt.Errorf("%w: cross entropy stats=%v logits=%v targets=%v", ErrShape, stats, logits, targets)
	}
	return logits.Dim(0), logits.Dim(1), dtypes([]*tensor.Tensor{logits}, stats, targets)
}

// CombineDims checks CrossEntropyCombine's operands and returns (P, T).
func CombineDims(lse, loss, stats *tensor.Tensor) (p, t int, err error) {
	if stats.Rank() != 3 || stats.Dim(2) != 3 || lse.Rank() != 1 || lse.Dim(0) != stats.Dim(1) || loss.Len() != 1 || loss.DType() != tensor.Float64 {
		return 0, 0, fmt.Errorf("%w: cross entropy combine lse=%v loss=%v stats=%v (want lse[T], one float64, stats[P, T, 3])", ErrShape, lse, loss, stats)
	}
	return stats.Dim(0), stats.Dim(1), dtypes([]*tensor.Tensor{stats, lse})
}

// AdamWDims checks AdamW's step and operands: float32, one shape.
func AdamWDims(a AdamWParams, param, grad, m, v *tensor.Tensor) (int, error) {
	if a.Step < 1 {
		return 0, fmt.Errorf("%w: adamw step %d: steps count from 1", ErrShape, a.Step)
	}
	n, err := ElementwiseDims(param, grad, m, v)
	if err == nil && param.DType() != tensor.Float32 {
		err = fmt.Errorf("%w: adamw on %v: parameters and moments stay float32", ErrDType, param.DType())
	}
	return n, err
}

// AdamWScalars are the float32 factors of step a, as every provider
// computes them: decay = 1 − lr·wd, step = lr/(1 − β1^t), root =
// √(1 − β2^t), eps, w1 = 1 − β1, b2 = β2; then per element m += w1·(g − m),
// v = b2·v + (1 − b2)·g², p = p·decay − step·m/(√v/root + eps).
type AdamWScalars struct{ Decay, Step, Root, Eps, W1, B2 float32 }

// Scalars returns step a's factors.
func (a AdamWParams) Scalars() AdamWScalars {
	c1 := 1 - math.Pow(a.Beta1, float64(a.Step))
	c2 := 1 - math.Pow(a.Beta2, float64(a.Step))
	return AdamWScalars{float32(1 - a.LR*a.WeightDecay), float32(a.LR / c1), float32(math.Sqrt(c2)), float32(a.Eps), float32(1 - a.Beta1), float32(a.Beta2)}
}

// StatsDType is the dtype of the statistics (layer norms' mean and rstd,
// the log-sum-exps, the cross-entropy stats) and of the ids and targets
// that go with data of dtype dt: float32 for bfloat16 data (kept, and ids
// exact to 2²⁴, as mixed precision wants), dt otherwise.
func StatsDType(dt tensor.DType) tensor.DType {
	if dt == tensor.BFloat16 {
		return tensor.Float32
	}
	return dt
}

// dtypes checks that the data share one dtype (float32, float64 or
// bfloat16) and that the statistics and ids take StatsDType of it.
func dtypes(data []*tensor.Tensor, stats ...*tensor.Tensor) error {
	dt := data[0].DType()
	if dt != tensor.Float32 && dt != tensor.Float64 && dt != tensor.BFloat16 {
		return fmt.Errorf("%w: %v: these ops take float32, float64 or bfloat16", ErrDType, dt)
	}
	for _, t := range data {
		if t.DType() != dt {
			return fmt.Errorf("%w: %v with %v", ErrDType, dt, t.DType())
		}
	}
	for _, t := range stats {
		if t.DType() != StatsDType(dt) {
			return fmt.Errorf("%w: %v statistics or ids with %v data (want %v)", ErrDType, t.DType(), dt, StatsDType(dt))
		}
	}
	return nil
}

// NoTransformer is embedded by providers that lack the transformer ops: each
// returns ErrUnsupported (their Has reports false, so a Dispatcher sends
// them to the device's default provider).
type NoTransformer struct{ Name string }

func (n NoTransformer) unsupported(op Op) error {
	return fmt.Errorf("%w: %s %v", ErrUnsupported, n.Name, op)
}

// LayerNorm is not implemented.
func (n NoTransformer) LayerNorm(y, stats, x, gamma, beta *tensor.Tensor, eps float64) error {
	return n.unsupported(OpLayerNorm)
}

// LayerNormBackward is not implemented.
func (n NoTransformer) LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats *tensor.Tensor, accumulate bool) error {
	return n.unsupported(OpLayerNormBackward)
}

// Attention is not implemented.
func (n NoTransformer) Attention(o, lse, q, k, v *tensor.Tensor, causal bool) error {
	return n.unsupported(OpAttention)
}

// AttentionBackward is not implemented.
func (n NoTransformer) AttentionBackward(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool) error {
	return n.unsupported(OpAttentionBackward)
}

// Embedding is not implemented.
func (n NoTransformer) Embedding(y, ids, table *tensor.Tensor, offset int) error {
	return n.unsupported(OpEmbedding)
}

// EmbeddingBackward is not implemented.
func (n NoTransformer) EmbeddingBackward(dtable, dy, ids *tensor.Tensor, offset int, accumulate bool) error {
	return n.unsupported(OpEmbeddingBackward)
}

// CrossEntropy is not implemented.
func (n NoTransformer) CrossEntropy(stats, logits, targets *tensor.Tensor, offset int) error {
	return n.unsupported(OpCrossEntropy)
}

// CrossEntropyBackward is not implemented.
func (n NoTransformer) CrossEntropyBackward(dlogits, logits, targets, lse *tensor.Tensor, offset int, scale float64) error {
	return n.unsupported(OpCrossEntropyBackward)
}

// CrossEntropyCombine is not implemented.
func (n NoTransformer) CrossEntropyCombine(lse, loss, stats *tensor.Tensor) error {
	return n.unsupported(OpCrossEntropyCombine)
}

// AdamW is not implemented.
func (n NoTransformer) AdamW(p AdamWParams, param, grad, m, v *tensor.Tensor) error {
	return n.unsupported(OpAdamW)
}
