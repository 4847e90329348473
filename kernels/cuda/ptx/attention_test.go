//go:build cudaemu

package ptx

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// TestAttentionMatchesCPU: the attention kernels (forward; delta, dq, dk
// and dv backward) run on the CPU thread by thread against the cpu
// provider's attention, float32 and bfloat16, causal or not, separate q, k,
// v (more keys than queries) and a packed qkv.
func TestAttentionMatchesCPU(t *testing.T) {
	attentionMatchesCPU(t, 3, []tensor.DType{tensor.Float32, tensor.BFloat16}, Attention, AttentionBackward, attnSize{2, 3, 5, 7, 0, 0})
}

// TestAttentionGEMMMatchesCPU: the provider's attention through GEMMs
// (ptx.Attn's Scores, Out and Backward GEMMs run on the host, its softmax,
// delta and ds kernels thread by thread) against the cpu provider's, float32
// and bfloat16 (P and dS rounded to bfloat16 for the GEMMs after them),
// causal or not, separate q, k, v (more keys than queries) and a packed qkv,
// more than one batch and head; rows of keys shorter than the softmax's
// segment (ptx.SoftmaxSeg), and of 70 keys: two whole segments and a part,
// and under the causal mask, segments wholly past it; all batches in one
// chunk, and chunks of a few batches (the last cut short); calls per batch
// (batches ≤ heads) and per head.
func TestAttentionGEMMMatchesCPU(t *testing.T) {
	for _, sz := range []attnSize{{2, 3, 5, 7, 0, 0}, {1, 2, 40, 70, 0, 0}, {5, 2, 5, 7, 0, 0}} {
		attentionMatchesCPU(t, 4, []tensor.DType{tensor.Float32, tensor.BFloat16}, AttentionGEMM, AttentionBackwardGEMM, sz)
	}
	// Chunks of two batches (the last of one), so that the scores' batches
	// count from the chunk's first: per batch (2 ≤ 3 heads) and per head
	// (2 batches > 1 head).
	defer func(b int) { attnBudget = b }(attnBudget)
	for _, sz := range []attnSize{{5, 3, 5, 7, 0, 0}, {5, 1, 5, 7, 0, 0}} {
		attnBudget = 2 * sz.h * sz.s * sz.tk * ScoreBytes(true, true)
		attentionMatchesCPU(t, 4, []tensor.DType{tensor.Float32, tensor.BFloat16}, AttentionGEMM, AttentionBackwardGEMM, sz)
	}
}

// TestFlashAttentionMatchesCPU: the fused kernels (attn_flash_*: a block
// at a time, its threads together at its barriers) against the cpu
// provider's attention, float32 and bfloat16, causal or not, separate q, k,
// v and a packed qkv: rows within one tile and across several (70 queries:
// two forward blocks, three backward blocks and tiles of keys; more keys
// than queries, and fewer), head dims of 4 and 6 and of 64 (the largest).
func TestFlashAttentionMatchesCPU(t *testing.T) {
	for _, sz := range []attnSize{{2, 3, 5, 7, 0, 0}, {1, 2, 70, 70, 0, 0}, {1, 1, 40, 100, 0, 0}, {1, 1, 100, 33, 0, 0}, {1, 2, 33, 40, 64, 64}, {2, 1, 9, 9, 64, 32}} {
		attentionMatchesCPU(t, 5, []tensor.DType{tensor.Float32, tensor.BFloat16}, FlashAttention, FlashAttentionBackward, sz)
	}
	q, o, lse := tensor.New(tensor.Float32, 1, 4, 1, 65), tensor.New(tensor.Float32, 1, 4, 1, 65), tensor.New(tensor.Float32, 1, 1, 4)
	if err := FlashAttention(o, lse, q, q, q, true, 1); err == nil {
		t.Error("FlashAttention took a head of 65")
	}
}

// attnSize is an attention test's batch, heads, queries and keys (as many
// keys as queries where q packs k and v), and head dims E and F (0: 4 and
// 6).
type attnSize struct{ b, h, s, tk, e, f int }

// attentionMatchesCPU checks an emulated attention's forward and backward
// against the cpu provider's, for each dtype of dts, packed or not, causal
// or not (the tensors drawn from seed), at size sz.
func attentionMatchesCPU(t *testing.T, seed int64, dts []tensor.DType,
	fwd func(o, lse, q, k, v *tensor.Tensor, causal bool, threads int) error,
	bwd func(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool, threads int) error, sz attnSize) {
	rng := rand.New(rand.NewSource(seed))
	p := cpuP(t)
	st := kernels.StatsDType(tensor.BFloat16)
	b, h, s := sz.b, sz.h, sz.s
	e, f := 4, 6
	if sz.e > 0 {
		e, f = sz.e, sz.f
	}
	for _, dt := range dts {
		tol := 4 * tolOf(dt)
		for _, packed := range []bool{false, true} {
			for _, causal := range []bool{false, true} {
				name := fmt.Sprintf("%v %+v packed=%v causal=%v", dt, sz, packed, causal)
				var q, k, v, dq, dk, dv *tensor.Tensor
				tk, ff := sz.tk, f
				if packed {
					tk, ff = s, e
					q = randn(rng, dt, 1, b, s, h, 3, e)
				} else {
					q, k, v = randn(rng, dt, 1, b, s, h, e), randn(rng, dt, 1, b, tk, h, e), randn(rng, dt, 1, b, tk, h, f)
				}
				o, lse := tensor.New(dt, b, s, h, ff), tensor.New(st, b, h, s)
				wo, wlse := tensor.New(dt, b, s, h, ff), tensor.New(st, b, h, s)
				if err := fwd(o, lse, q, k, v, causal, 7); err != nil {
					t.Fatal(err)
				}
				if err := p.Attention(wo, wlse, q, k, v, causal); err != nil {
					t.Fatal(err)
				}
				same(t, name+" o", o, wo, tol)
				same(t, name+" lse", lse, wlse, 2e-6)

				do := randn(rng, dt, 1, b, s, h, ff)
				dq = tensor.New(dt, q.Shape()...)
				wdq := tensor.New(dt, q.Shape()...)
				var wdk, wdv *tensor.Tensor
				if !packed {
					dk, dv = tensor.New(dt, k.Shape()...), tensor.New(dt, v.Shape()...)
					wdk, wdv = tensor.New(dt, k.Shape()...), tensor.New(dt, v.Shape()...)
				}
				if err := bwd(dq, dk, dv, do, q, k, v, wo, wlse, causal, 5); err != nil {
					t.Fatal(err)
				}
				if err := p.AttentionBackward(wdq, wdk, wdv, do, q, k, v, wo, wlse, causal); err != nil {
					t.Fatal(err)
				}
				same(t, name+" dq", dq, wdq, tol)
				if !packed {
					same(t, name+" dk", dk, wdk, tol)
					same(t, name+" dv", dv, wdv, tol)
				}
			}
		}
	}
}
