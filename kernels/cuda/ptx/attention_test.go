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
	rng := rand.New(rand.NewSource(3))
	p := cpuP(t)
	st := kernels.StatsDType(tensor.BFloat16)
	const b, h, s, e, f = 2, 3, 5, 4, 6
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
		tol := 4 * tolOf(dt)
		for _, packed := range []bool{false, true} {
			for _, causal := range []bool{false, true} {
				name := fmt.Sprintf("%v packed=%v causal=%v", dt, packed, causal)
				var q, k, v, dq, dk, dv *tensor.Tensor
				tk, ff := 7, f
				if packed {
					tk, ff = s, e
					q = randn(rng, dt, 1, b, s, h, 3, e)
				} else {
					q, k, v = randn(rng, dt, 1, b, s, h, e), randn(rng, dt, 1, b, tk, h, e), randn(rng, dt, 1, b, tk, h, f)
				}
				o, lse := tensor.New(dt, b, s, h, ff), tensor.New(st, b, h, s)
				wo, wlse := tensor.New(dt, b, s, h, ff), tensor.New(st, b, h, s)
				if err := Attention(o, lse, q, k, v, causal, 7); err != nil {
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
				if err := AttentionBackward(dq, dk, dv, do, q, k, v, wo, wlse, causal, 5); err != nil {
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

// TestAttentionGEMMMatchesCPU: the provider's attention through GEMMs
// (ptx.Attn's Scores, Out and Backward GEMMs run on the host, its softmax,
// delta and ds kernels thread by thread) against the cpu provider's, float32,
// causal or not, separate q, k, v (more keys than queries) and a packed qkv,
// more than one batch and head.
func TestAttentionGEMMMatchesCPU(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	p := cpuP(t)
	st := kernels.StatsDType(tensor.Float32)
	const b, h, s, e, f = 2, 3, 5, 4, 6
	tol := 4 * tolOf(tensor.Float32)
	for _, packed := range []bool{false, true} {
		for _, causal := range []bool{false, true} {
			name := fmt.Sprintf("packed=%v causal=%v", packed, causal)
			var q, k, v, dk, dv, wdk, wdv *tensor.Tensor
			tk, ff := 7, f
			if packed {
				tk, ff = s, e
				q = randn(rng, tensor.Float32, 1, b, s, h, 3, e)
			} else {
				q, k, v = randn(rng, tensor.Float32, 1, b, s, h, e), randn(rng, tensor.Float32, 1, b, tk, h, e), randn(rng, tensor.Float32, 1, b, tk, h, f)
			}
			o, lse := tensor.New(tensor.Float32, b, s, h, ff), tensor.New(st, b, h, s)
			wo, wlse := tensor.New(tensor.Float32, b, s, h, ff), tensor.New(st, b, h, s)
			if err := AttentionGEMM(o, lse, q, k, v, causal, 7); err != nil {
				t.Fatal(err)
			}
			if err := p.Attention(wo, wlse, q, k, v, causal); err != nil {
				t.Fatal(err)
			}
			same(t, name+" o", o, wo, tol)
			same(t, name+" lse", lse, wlse, 2e-6)

			do := randn(rng, tensor.Float32, 1, b, s, h, ff)
			dq, wdq := tensor.New(tensor.Float32, q.Shape()...), tensor.New(tensor.Float32, q.Shape()...)
			if !packed {
				dk, dv = tensor.New(tensor.Float32, k.Shape()...), tensor.New(tensor.Float32, v.Shape()...)
				wdk, wdv = tensor.New(tensor.Float32, k.Shape()...), tensor.New(tensor.Float32, v.Shape()...)
			}
			if err := AttentionBackwardGEMM(dq, dk, dv, do, q, k, v, wo, wlse, causal, 5); err != nil {
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
