//go:build cuda

package cuda

import (
	"math"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cuda/ptx"
	"github.com/meshrun/meshrun/tensor"
)

// Attention through cuBLAS: per batch, the heads' scores S = q·kᵀ/√E in one
// strided-batched GEMM (a batch per head), the softmax in place in stages
// (attnSoftmax), then o = P·v in another; the backward recomputes P from
// lse and runs dP = do·vᵀ, dv = Pᵀ·do, ds = P ⊙ (dP − Σ do·o)/√E (attn_ds),
// dq = ds·k and dk = dsᵀ·q. Everything is float32 (the GEMMs accumulate in
// float32, TF32 only with Options.TF32); bfloat16 operands are widened
// first and the results rounded once. The scores of one batch (heads × S ×
// T floats, twice in the backward) are scratch: when they would pass
// maxAttnScratch bytes the kernels' one-row-per-thread path runs instead.

// maxAttnScratch bounds the scores scratch of the GEMM path, in bytes.
const maxAttnScratch = 1 << 30

// attnGEMM reports whether attention of shape a takes the GEMM path.
func (p *Provider) attnGEMM(a ptx.Attn, backward bool) bool {
	n := a.H * a.S * a.T * 4
	if backward {
		n *= 2
	}
	return !p.opts.AttnKernels && a.T > 0 && n <= maxAttnScratch
}

// attnF32 holds float32 views of an attention's operands: the tensors
// themselves when they are float32, else widened copies (packed: one copy
// of the packed tensor).
type attnF32 struct {
	p    *Provider
	tmp  []*tensor.Tensor
	fail error
}

// in returns t as float32 (nil stays nil).
func (w *attnF32) in(t *tensor.Tensor) *tensor.Tensor {
	if t == nil || t.DType() == tensor.Float32 || w.fail != nil {
		return t
	}
	c, err := w.p.mem.Alloc(tensor.Float32, t.Shape()...)
	if err == nil {
		err = w.p.Cast(c, t)
	}
	if err != nil {
		w.fail = err
		return t
	}
	w.tmp = append(w.tmp, c)
	return c
}

// out returns a float32 tensor to write t's values into (t itself when it
// is float32; nil stays nil).
func (w *attnF32) out(t *tensor.Tensor) *tensor.Tensor {
	if t == nil || t.DType() == tensor.Float32 || w.fail != nil {
		return t
	}
	c, err := w.p.mem.Alloc(tensor.Float32, t.Shape()...)
	if err != nil {
		w.fail = err
		return t
	}
	w.tmp = append(w.tmp, c)
	return c
}

// back rounds the float32 results into the outputs (pairs of out, its
// float32 tensor) and frees the copies.
func (w *attnF32) back(pairs ...*tensor.Tensor) error {
	defer func() {
		for _, t := range w.tmp {
			w.p.freeAfter(t)
		}
	}()
	if w.fail != nil {
		return w.fail
	}
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i] != nil && pairs[i] != pairs[i+1] {
			if err := w.p.Cast(pairs[i], pairs[i+1]); err != nil {
				return err
			}
		}
	}
	return nil
}

// attnSegments is how many segments of ptx.SoftmaxSeg keys a row of
// scores splits into.
func attnSegments(a ptx.Attn) int { return (a.T + ptx.SoftmaxSeg - 1) / ptx.SoftmaxSeg }

// attnSoftmax makes one batch's scores at sc (heads × S × T float32)
// probabilities in place, in stages, as layer norm: attn_smax_part (a
// thread per segment of a row: its largest score and sum of exponentials,
// into part, 2·heads·S·attnSegments doubles), attn_smax_lse (a thread per
// row: its log-sum-exp, into lse), attn_smax_exp (a thread per score). With
// part 0 it reads lse instead of writing it: the backward's recompute. (One
// thread per row of T scores, three passes over it, took most of the GPT's
// attention on the H100.)
func (p *Provider) attnSoftmax(a ptx.Attn, sc, lse, part uint64, causal bool) error {
	rows, c := a.H*a.S, uint64(int(betaIf(causal)))
	if part != 0 {
		ns := attnSegments(a)
		if err := p.launch("attn_smax_part", rows*ns, 0, ptx.BlockThreads, part, sc, uint64(rows), uint64(a.S), uint64(a.T), c, ptx.SoftmaxSeg); err != nil {
			return err
		}
		if err := p.launch("attn_smax_lse", rows, 0, ptx.BlockThreads, lse, part, uint64(rows), uint64(ns)); err != nil {
			return err
		}
	}
	return p.launch("attn_smax_exp", rows*a.T, 0, ptx.BlockThreads, sc, lse, uint64(rows), uint64(a.S), uint64(a.T), c)
}

// headGEMM runs g (one of ptx.Attn's GEMMs) over the heads of batch b, its
// operands at the addresses ops gives.
func (p *Provider) headGEMM(g ptx.HeadGEMM, ops map[ptx.Operand]uint64, heads, b int) error {
	return p.gemm(kernels.GemmParams{M: g.M, N: g.N, K: g.K, TransA: g.TransA, TransB: g.TransB, Alpha: g.Alpha, DType: tensor.Float32,
		LDA: g.LDA, LDB: g.LDB, LDC: g.LDC, StrideA: g.SA, StrideB: g.SB, StrideC: g.SC, BatchCount: heads},
		ops[g.A]+uint64(4*b*g.BA), ops[g.B]+uint64(4*b*g.BB), ops[g.C]+uint64(4*b*g.BC))
}

// attentionGEMM is Attention on the GEMM path.
func (p *Provider) attentionGEMM(a ptx.Attn, o, lse, q, k, v *tensor.Tensor, causal bool) error {
	w := &attnF32{p: p}
	q32, k32, v32, o32 := w.in(q), w.in(k), w.in(v), w.out(o)
	if w.fail != nil {
		return w.back()
	}
	sc, err := p.mem.Alloc(tensor.Float32, a.H*a.S*a.T)
	if err != nil {
		w.back()
		return err
	}
	defer p.freeAfter(sc)
	part, err := p.mem.Alloc(tensor.Float64, 2*a.H*a.S*attnSegments(a))
	if err != nil {
		w.back()
		return err
	}
	defer p.freeAfter(part)
	qp, kp, vp := attnViews(a, q32, k32, v32)
	ops := map[ptx.Operand]uint64{ptx.OpQ: qp, ptx.OpK: kp, ptx.OpV: vp, ptx.OpO: dev(o32), ptx.OpP: dev(sc)}
	rows := uint64(a.H * a.S)
	err = p.do(func() error {
		for b := range a.B {
			if err := p.headGEMM(a.Scores(), ops, a.H, b); err != nil {
				return err
			}
			if err := p.attnSoftmax(a, dev(sc), dev(lse)+uint64(4*b)*rows, dev(part), causal); err != nil {
				return err
			}
			if err := p.headGEMM(a.Out(), ops, a.H, b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		w.back()
		return err
	}
	return w.back(o, o32)
}

// attentionBackwardGEMM is AttentionBackward on the GEMM path.
func (p *Provider) attentionBackwardGEMM(a ptx.Attn, dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool) error {
	rows := a.B * a.H * a.S
	delta, err := p.mem.Alloc(tensor.Float64, rows)
	if err != nil {
		return err
	}
	defer p.freeAfter(delta)
	if err := p.do(func() error {
		return p.launch("attn_delta"+suffix(q.DType()), rows, 0, ptx.BlockThreads,
			dev(delta), dev(do), dev(o), uint64(a.B), uint64(a.H), uint64(a.S), uint64(a.F))
	}); err != nil {
		return err
	}
	w := &attnF32{p: p}
	q32, k32, v32, do32 := w.in(q), w.in(k), w.in(v), w.in(do)
	dq32, dk32, dv32 := w.out(dq), w.out(dk), w.out(dv)
	if w.fail != nil {
		return w.back()
	}
	sc, err := p.mem.Alloc(tensor.Float32, 2*a.H*a.S*a.T)
	if err != nil {
		w.back()
		return err
	}
	defer p.freeAfter(sc)
	pp, ds := dev(sc), dev(sc)+uint64(4*a.H*a.S*a.T)
	qp, kp, vp := attnViews(a, q32, k32, v32)
	gq, gk, gv := attnViews(a, dq32, dk32, dv32)
	ops := map[ptx.Operand]uint64{ptx.OpQ: qp, ptx.OpK: kp, ptx.OpV: vp, ptx.OpDO: dev(do32), ptx.OpP: pp, ptx.OpDS: ds,
		ptx.OpDQ: gq, ptx.OpDK: gk, ptx.OpDV: gv}
	dpG, dvG, dqG, dkG := a.Backward()
	hr := uint64(a.H * a.S)
	scale := float32(1 / math.Sqrt(float64(a.E)))
	err = p.do(func() error {
		for b := range a.B {
			if err := p.headGEMM(a.Scores(), ops, a.H, b); err != nil {
				return err
			}
			if err := p.attnSoftmax(a, pp, dev(lse)+uint64(4*b)*hr, 0, causal); err != nil {
				return err
			}
			for _, g := range []ptx.HeadGEMM{dpG, dvG} {
				if err := p.headGEMM(g, ops, a.H, b); err != nil {
					return err
				}
			}
			if err := p.launch("attn_ds_f32", int(hr)*a.T, 0, ptx.BlockThreads, ds, pp, dev(delta)+uint64(8*b)*hr,
				hr, uint64(a.T), uint64(math.Float32bits(scale))); err != nil {
				return err
			}
			for _, g := range []ptx.HeadGEMM{dqG, dkG} {
				if err := p.headGEMM(g, ops, a.H, b); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		w.back()
		return err
	}
	return w.back(dq, dq32, dk, dk32, dv, dv32)
}
