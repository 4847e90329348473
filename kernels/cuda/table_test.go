package cuda

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/kernels/cuda/ptx"
	"github.com/meshrun/meshrun/kernels/kerneltest"
	"github.com/meshrun/meshrun/tensor"
)

// The dispatch table: what serves each call of the conformance suite on the
// cuda provider. The suite runs against a recorder, which forwards every
// call to a provider and notes, per call, the op, its dtypes and layout, and
// the path (plan.go) that serves it on the cuda provider: without a GPU
// (TestDispatchPlan, the cpu provider computing) under both of cuBLASLt's
// answers; on a GPU (TestDispatchTable) as the provider took it.

// call is one recorded call, reduced to what its plan depends on.
type call struct {
	op, layout string
	paths      []string // the path(s) that serve it
	refused    bool     // a plan with a Refused step
}

// recorder is kernels.Kernels over k, recording each call.
type recorder struct {
	k kernels.Kernels
	// served, if set, says how the provider served the last GEMM (the
	// cuda provider's own account); otherwise the GEMM's plan is shown
	// with cuBLASLt accepting and refusing.
	served func() string

	mu    sync.Mutex
	calls []call
}

func (r *recorder) add(c call) {
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
}

// Has forwards to the provider (the suite skips what it lacks).
func (r *recorder) Has(op kernels.Op) bool {
	h, ok := r.k.(interface{ Has(kernels.Op) bool })
	return !ok || h.Has(op)
}

func (r *recorder) Gemm(g kernels.GemmParams, o kernels.GemmOperands) error {
	err := r.k.Gemm(g, o)
	if _, bad := kernels.CheckGemm(g, o); bad != nil {
		return err // the suite's error cases: refused before any plan
	}
	c, _ := gemmCall(g)
	if r.served != nil && err == nil && !empty(g.Normalized()) {
		c.paths = []string{r.served()}
	}
	r.add(c)
	return err
}

// GroupedGemm records each expert's GEMM as the cuda provider runs it: by
// its plan (an expert whose windows are not 256-byte aligned skips cuBLASLt).
func (r *recorder) GroupedGemm(g kernels.GroupedParams, o kernels.GemmOperands) error {
	err := r.k.GroupedGemm(g, o)
	if kernels.CheckGrouped(g, o) != nil {
		return err // the suite's error cases: refused before any plan
	}
	for _, x := range g.Experts() {
		c, _ := gemmCall(x.Gemm)
		c.op = kernels.OpGroupedGemm.String() + " " + c.op
		r.add(c)
	}
	return err
}

func empty(g kernels.GemmParams) bool { return g.M == 0 || g.N == 0 || g.K == 0 }

// gemmCall describes GEMM g: its op, dtypes and the layout its plan
// depends on, and its plan under both of cuBLASLt's answers.
func gemmCall(g kernels.GemmParams) (call, gemmPlan) {
	g = g.Normalized()
	layout := fmt.Sprintf("%v→%v", g.DType, g.Out())
	switch {
	case g.BatchCount > 1:
		layout += " batched"
	case g.LDC > g.N:
		layout += " padded C"
	default:
		layout += " tight C"
	}
	if g.Beta != 0 {
		layout += ", beta≠0"
	}
	c := call{op: g.Epilogue.Op().String()}
	if empty(g) {
		c.layout = layout + ", empty (M, N or K = 0)"
		c.paths = []string{"kernels.EmptyGemm: no library sees it (K = 0: a K = 1 GEMM of zeros; N = 0 bias gradient: a GEMM with ones)"}
		return c, gemmPlan{}
	}
	pl := planGemm(g)
	c.layout, c.refused = layout, pl.refused()
	c.paths = []string{pl.describe(g, false)}
	if pl.lt {
		c.paths = append(c.paths, pl.describe(g, true))
	}
	return c, pl
}

// op records a non-GEMM op on data of dt with output out.
func (r *recorder) op(op kernels.Op, dt, out tensor.DType, wideHeads bool) {
	path := opPath(op, dt, out, wideHeads)
	layout := dt.String()
	if out != dt {
		layout += "→" + out.String()
	}
	if wideHeads {
		layout += ", heads over ptx.MaxHeadDim"
	}
	r.add(call{op: op.String(), layout: layout, paths: []string{path.String()}, refused: path == Refused})
}

func (r *recorder) Gemv(g kernels.GemvParams, a, x, y *tensor.Tensor) error {
	r.op(kernels.OpGemv, y.DType(), y.DType(), false)
	return r.k.Gemv(g, a, x, y)
}

func (r *recorder) GeluForward(y, x *tensor.Tensor) error {
	r.op(kernels.OpGeluForward, x.DType(), y.DType(), false)
	return r.k.GeluForward(y, x)
}

func (r *recorder) GeluBackward(dx, dy, x *tensor.Tensor) error {
	r.op(kernels.OpGeluBackward, x.DType(), dx.DType(), false)
	return r.k.GeluBackward(dx, dy, x)
}

func (r *recorder) BiasGrad(db, dy *tensor.Tensor, accumulate bool) error {
	r.op(kernels.OpBiasGrad, dy.DType(), db.DType(), false)
	return r.k.BiasGrad(db, dy, accumulate)
}

func (r *recorder) Axpy(alpha float64, x, y *tensor.Tensor) error {
	r.op(kernels.OpAxpy, y.DType(), y.DType(), false)
	return r.k.Axpy(alpha, x, y)
}

func (r *recorder) MSE(dy, sum, y, target *tensor.Tensor, scale float64) error {
	r.op(kernels.OpMSE, y.DType(), dy.DType(), false)
	return r.k.MSE(dy, sum, y, target, scale)
}

func (r *recorder) Cast(dst, src *tensor.Tensor) error {
	r.op(kernels.OpCast, src.DType(), dst.DType(), false)
	return r.k.Cast(dst, src)
}

func (r *recorder) LayerNorm(y, stats, x, gamma, beta *tensor.Tensor, eps float64) error {
	r.op(kernels.OpLayerNorm, x.DType(), x.DType(), false)
	return r.k.LayerNorm(y, stats, x, gamma, beta, eps)
}

func (r *recorder) LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats *tensor.Tensor, accumulate bool) error {
	r.op(kernels.OpLayerNormBackward, x.DType(), x.DType(), false)
	return r.k.LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats, accumulate)
}

func wideAttention(o, lse, q, k, v *tensor.Tensor) bool {
	a, err := ptx.AttnShape(o, lse, q, k, v)
	return err == nil && wide(a)
}

func (r *recorder) Attention(o, lse, q, k, v *tensor.Tensor, causal bool) error {
	r.op(kernels.OpAttention, q.DType(), o.DType(), wideAttention(o, lse, q, k, v))
	return r.k.Attention(o, lse, q, k, v, causal)
}

func (r *recorder) AttentionBackward(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool) error {
	r.op(kernels.OpAttentionBackward, q.DType(), dq.DType(), wideAttention(o, lse, q, k, v))
	return r.k.AttentionBackward(dq, dk, dv, do, q, k, v, o, lse, causal)
}

func (r *recorder) Embedding(y, ids, table *tensor.Tensor, offset int) error {
	r.op(kernels.OpEmbedding, table.DType(), y.DType(), false)
	return r.k.Embedding(y, ids, table, offset)
}

func (r *recorder) EmbeddingBackward(dtable, dy, ids *tensor.Tensor, offset int, accumulate bool) error {
	r.op(kernels.OpEmbeddingBackward, dy.DType(), dtable.DType(), false)
	return r.k.EmbeddingBackward(dtable, dy, ids, offset, accumulate)
}

func (r *recorder) CrossEntropy(stats, logits, targets *tensor.Tensor, offset int) error {
	r.op(kernels.OpCrossEntropy, logits.DType(), logits.DType(), false)
	return r.k.CrossEntropy(stats, logits, targets, offset)
}

func (r *recorder) CrossEntropyBackward(dlogits, logits, targets, lse *tensor.Tensor, offset int, scale float64) error {
	r.op(kernels.OpCrossEntropyBackward, logits.DType(), dlogits.DType(), false)
	return r.k.CrossEntropyBackward(dlogits, logits, targets, lse, offset, scale)
}

func (r *recorder) CrossEntropyCombine(lse, loss, stats *tensor.Tensor) error {
	r.op(kernels.OpCrossEntropyCombine, lse.DType(), lse.DType(), false)
	return r.k.CrossEntropyCombine(lse, loss, stats)
}

func (r *recorder) AdamW(a kernels.AdamWParams, param, grad, m, v *tensor.Tensor) error {
	r.op(kernels.OpAdamW, param.DType(), param.DType(), false)
	return r.k.AdamW(a, param, grad, m, v)
}

// table is the recorded calls grouped by op and layout: each group's paths
// with how many calls took each.
func (r *recorder) table() (string, []string) {
	type key struct{ op, layout string }
	groups := map[key]map[string]int{}
	var refused []string
	for _, c := range r.calls {
		k := key{c.op, c.layout}
		if groups[k] == nil {
			groups[k] = map[string]int{}
		}
		groups[k][strings.Join(c.paths, "\n      if ")]++
		if c.refused {
			refused = append(refused, c.op+" "+c.layout)
		}
	}
	keys := slices.SortedFunc(maps.Keys(groups), func(a, b key) int {
		return strings.Compare(a.op+"\x00"+a.layout, b.op+"\x00"+b.layout)
	})
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%-22s %s\n", k.op, k.layout)
		for _, p := range slices.Sorted(maps.Keys(groups[k])) {
			fmt.Fprintf(&b, "    %5d× %s\n", groups[k][p], p)
		}
	}
	return b.String(), slices.Compact(slices.Sorted(slices.Values(refused)))
}

// runTable runs the conformance suite through a recorder over k on memory
// mem and reports the table; a call the provider claims but its plan
// refuses fails the test.
func runTable(t *testing.T, k kernels.Kernels, mem tensor.Memory, served func() string) {
	r := &recorder{k: k, served: served}
	t.Run("suite", func(t *testing.T) {
		kerneltest.Run(t, kerneltest.Config{
			New:    func(int) (kernels.Kernels, error) { return r, nil },
			Memory: mem,
			DTypes: providerDTypes,
			Short:  true,
		})
	})
	table, refused := r.table()
	t.Logf("what serves each call of the conformance suite on the cuda provider (calls per path):\n%s", table)
	if len(r.calls) == 0 {
		t.Fatal("the suite made no calls")
	}
	for _, c := range refused {
		t.Errorf("claimed but refused: %s", c)
	}
}

// TestDispatchPlan prints the cuda provider's dispatch table for every call
// of the conformance suite (run here on the cpu provider, which computes;
// the table is the cuda provider's plans for the same calls), with
// cuBLASLt accepting each GEMM it is tried on and refusing it, and fails
// on a call the provider claims but no plan serves.
func TestDispatchPlan(t *testing.T) {
	p, err := cpu.New(cpu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	runTable(t, p, nil, nil)
}

// TestPlansServeEveryClaim checks the plans against what the provider
// claims beyond the suite's calls: every GEMM dtype pair, epilogue, layout
// and beta, and every op on every dtype it lists.
func TestPlansServeEveryClaim(t *testing.T) {
	for _, in := range providerDTypes {
		for _, out := range providerDTypes {
			if !kernels.GemmDTypes(in, out) {
				continue
			}
			for e := kernels.EpilogueNone; e <= kernels.EpilogueBGrad; e++ {
				for _, ldc := range []int{0, 3} {
					for _, beta := range []float64{0, 1} {
						g := kernels.GemmParams{M: 5, N: 6, K: 7, Alpha: 1, Beta: beta, DType: in, OutDType: out, Epilogue: e}.Normalized()
						g.LDC += ldc
						if pl := planGemm(g); pl.refused() || len(pl.steps) == 0 {
							t.Errorf("%v %v→%v LDC %d beta %v: no plan serves it: %s", e.Op(), in, out, g.LDC, beta, pl.describe(g, true))
						}
					}
				}
			}
			g := kernels.GemmParams{M: 5, N: 6, K: 7, Alpha: 1, BatchCount: 3, DType: in, OutDType: out}.Normalized()
			if pl := planGemm(g); pl.refused() || pl.lt {
				t.Errorf("batched %v→%v: %s", in, out, pl.describe(g, true))
			}
		}
	}
	for kind := kernels.GroupedForward; kind <= kernels.GroupedBackwardWeight; kind++ {
		for e := kernels.EpilogueNone; e <= kernels.EpilogueBGrad; e++ {
			for _, in := range providerDTypes {
				for _, out := range providerDTypes {
					g := kernels.GroupedParams{Kind: kind, Rows: []int{3, 0, 5}, N: 6, K: 7, DType: in, OutDType: out, Epilogue: e}
					if g.Validate() != nil {
						continue
					}
					for _, x := range g.Experts() {
						if pl := planGemm(x.Gemm); !empty(x.Gemm) && (pl.refused() || len(pl.steps) == 0) {
							t.Errorf("grouped %v %v %v→%v: no plan serves an expert: %s", kind, e, in, out, pl.describe(x.Gemm, true))
						}
					}
				}
			}
		}
	}
	for _, op := range kernels.Ops() {
		if op.String() == "gemm" || strings.HasPrefix(op.String(), "gemm_") {
			continue // planGemm's
		}
		for _, dt := range providerDTypes {
			switch {
			case op == kernels.OpGemv && dt == tensor.BFloat16, op == kernels.OpAdamW && dt != tensor.Float32:
				// The ops' own checks refuse these dtypes on every provider
				// (kernels.CheckGemv, kernels.AdamWDims).
				continue
			}
			if opPath(op, dt, dt, false) == Refused {
				t.Errorf("%v on %v: refused", op, dt)
			}
		}
	}
}
