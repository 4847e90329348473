//go:build cuda

package cuda

import (
	"math"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cuda/ptx"
	"github.com/meshrun/meshrun/tensor"
)

// Attention through cuBLAS, over chunks of batches (ptx.Attn.ChunkBatches:
// as many as ptx.AttnScratchBudget of scratch holds): the scores S =
// q·kᵀ/√E in strided-batched GEMMs (one call per batch over its heads, or
// one per head over the chunk's batches, whichever is fewer:
// ptx.Attn.Calls), the softmax in place in stages (attnSoftmax, one launch
// each for the chunk), then o = P·v; the backward recomputes P from
// lse and runs dP = do·vᵀ, dv = Pᵀ·do, ds = P ⊙ (dP − Σ do·o)/√E (attn_ds),
// dq = ds·k and dk = dsᵀ·q. The scores, the softmax and ds are float32; the
// GEMMs multiply the operands in their own dtype and accumulate in float32
// (TF32 only with Options.TF32): in bfloat16 on tensor cores, P and ds
// rounded to bfloat16 before the GEMMs that take them (ptx.Half), every
// result rounded once. The scores of a chunk (heads × S × T floats per
// batch, twice in the backward, and their bfloat16 copies) are scratch:
// when one batch's would pass maxAttnScratch bytes the kernels'
// one-row-per-thread path runs instead.

// maxAttnScratch bounds one batch's scores scratch on the GEMM path, in
// bytes: above it the kernels run.
const maxAttnScratch = 1 << 30

// attnGEMM reports whether attention of shape a in dt takes the GEMM path.
func (p *Provider) attnGEMM(a ptx.Attn, dt tensor.DType, backward bool) bool {
	n := a.H * a.S * a.T * ptx.ScoreBytes(dt == tensor.BFloat16, backward)
	return !p.opts.AttnKernels && a.T > 0 && n <= maxAttnScratch
}

// attnFused reports whether attention of shape a runs on the fused kernels
// (Options.AttnFused, head dims they take).
func (p *Provider) attnFused(a ptx.Attn) bool { return p.opts.AttnFused && a.Flash() }

// attnScratch is one GEMM-path call's device scratch, freed by done.
type attnScratch struct {
	p    *Provider
	tmp  []*tensor.Tensor
	fail error
}

// alloc is n elements of dt (nil, and no error, for n 0).
func (s *attnScratch) alloc(dt tensor.DType, n int) *tensor.Tensor {
	if n == 0 || s.fail != nil {
		return nil
	}
	t, err := s.p.mem.Alloc(dt, n)
	if err != nil {
		s.fail = err
		return nil
	}
	s.tmp = append(s.tmp, t)
	return t
}

func (s *attnScratch) done() {
	for _, t := range s.tmp {
		s.p.freeAfter(t)
	}
}

// attnSegments is how many segments of ptx.SoftmaxSeg keys a row of
// scores splits into.
func attnSegments(a ptx.Attn) int { return (a.T + ptx.SoftmaxSeg - 1) / ptx.SoftmaxSeg }

// attnSoftmax makes the scores of nb batches at sc (nb × heads × S × T
// float32) probabilities in place, in stages, as layer norm: attn_smax_part
// (a thread per segment of a row: its largest score and sum of
// exponentials, into part, 2·rows·attnSegments doubles), attn_smax_lse (a thread per
// row: its log-sum-exp, into lse), attn_smax_exp (a thread per score, and
// the bfloat16 rounding into p16 unless it is 0). With part 0 it reads lse
// instead of writing it: the backward's recompute. (One thread per row of
// T scores, three passes over it, took most of the GPT's attention on the
// H100.)
func (p *Provider) attnSoftmax(a ptx.Attn, nb int, sc, p16, lse, part uint64, causal bool) error {
	rows, c := nb*a.H*a.S, uint64(int(betaIf(causal)))
	if part != 0 {
		ns := attnSegments(a)
		if err := p.launch("attn_smax_part", rows*ns, 0, ptx.BlockThreads, part, sc, uint64(rows), uint64(a.S), uint64(a.T), c, ptx.SoftmaxSeg); err != nil {
			return err
		}
		if err := p.launch("attn_smax_lse", rows, 0, ptx.BlockThreads, lse, part, uint64(rows), uint64(ns)); err != nil {
			return err
		}
	}
	return p.launch("attn_smax_exp", rows*a.T, 0, ptx.BlockThreads, sc, p16, lse, uint64(rows), uint64(a.S), uint64(a.T), c)
}

// attnOperands are the GEMMs' operands: each one's address and dtype (q,
// k, v, o and the gradients in the attention's dtype; P and dS float32;
// P16 and DS16 bfloat16).
type attnOperands struct {
	at map[ptx.Operand]uint64
	dt map[ptx.Operand]tensor.DType
}

func newAttnOperands(dt tensor.DType) attnOperands {
	o := attnOperands{at: map[ptx.Operand]uint64{}, dt: map[ptx.Operand]tensor.DType{}}
	for _, op := range []ptx.Operand{ptx.OpQ, ptx.OpK, ptx.OpV, ptx.OpO, ptx.OpDO, ptx.OpDQ, ptx.OpDK, ptx.OpDV} {
		o.dt[op] = dt
	}
	o.dt[ptx.OpP], o.dt[ptx.OpDS] = tensor.Float32, tensor.Float32
	o.dt[ptx.OpP16], o.dt[ptx.OpDS16] = tensor.BFloat16, tensor.BFloat16
	return o
}

// headGEMM runs g (one of ptx.Attn's GEMMs) over the batches b0 to
// b0+nb−1, in ptx.Attn.Calls' calls.
func (p *Provider) headGEMM(a ptx.Attn, g ptx.HeadGEMM, ops attnOperands, b0, nb int) error {
	at := func(op ptx.Operand, elems int) uint64 { return ops.at[op] + uint64(ops.dt[op].Size()*elems) }
	for _, c := range a.Calls(g, b0, nb) {
		if err := p.gemm(kernels.GemmParams{M: g.M, N: g.N, K: g.K, TransA: g.TransA, TransB: g.TransB, Alpha: g.Alpha,
			DType: ops.dt[g.A], OutDType: ops.dt[g.C], LDA: g.LDA, LDB: g.LDB, LDC: g.LDC,
			StrideA: c.Stride[0], StrideB: c.Stride[1], StrideC: c.Stride[2], BatchCount: c.Count},
			at(g.A, c.Off[0]), at(g.B, c.Off[1]), at(g.C, c.Off[2])); err != nil {
			return err
		}
	}
	return nil
}

// half is g as the attention's dtype runs it: reading the bfloat16 copies
// of P and dS in bfloat16.
func half(g ptx.HeadGEMM, dt tensor.DType) ptx.HeadGEMM {
	if dt == tensor.BFloat16 {
		return ptx.Half(g)
	}
	return g
}

// attentionGEMM is Attention on the GEMM path.
func (p *Provider) attentionGEMM(a ptx.Attn, o, lse, q, k, v *tensor.Tensor, causal bool) error {
	dt := q.DType()
	nb := a.ChunkBatches(ptx.ScoreBytes(dt == tensor.BFloat16, false), ptx.AttnScratchBudget)
	n, hs := nb*a.H*a.S*a.T, a.H*a.S
	s := &attnScratch{p: p}
	defer s.done()
	sc, part := s.alloc(tensor.Float32, n), s.alloc(tensor.Float64, 2*nb*hs*attnSegments(a))
	var p16 *tensor.Tensor
	if dt == tensor.BFloat16 {
		p16 = s.alloc(tensor.BFloat16, n)
	}
	if s.fail != nil {
		return s.fail
	}
	ops := newAttnOperands(dt)
	qp, kp, vp := attnViews(a, q, k, v)
	for op, at := range map[ptx.Operand]uint64{ptx.OpQ: qp, ptx.OpK: kp, ptx.OpV: vp, ptx.OpO: dev(o), ptx.OpP: dev(sc), ptx.OpP16: devOr0(p16)} {
		ops.at[op] = at
	}
	return p.do(func() error {
		for b0 := 0; b0 < a.B; b0 += nb {
			c := min(nb, a.B-b0)
			if err := p.headGEMM(a, a.Scores(), ops, b0, c); err != nil {
				return err
			}
			if err := p.attnSoftmax(a, c, dev(sc), devOr0(p16), dev(lse)+uint64(4*b0*hs), dev(part), causal); err != nil {
				return err
			}
			if err := p.headGEMM(a, half(a.Out(), dt), ops, b0, c); err != nil {
				return err
			}
		}
		return nil
	})
}

// attentionBackwardGEMM is AttentionBackward on the GEMM path.
func (p *Provider) attentionBackwardGEMM(a ptx.Attn, dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool) error {
	dt, rows, hs := q.DType(), a.B*a.H*a.S, a.H*a.S
	nb := a.ChunkBatches(ptx.ScoreBytes(dt == tensor.BFloat16, true), ptx.AttnScratchBudget)
	n := nb * hs * a.T
	s := &attnScratch{p: p}
	defer s.done()
	delta, sc := s.alloc(tensor.Float64, rows), s.alloc(tensor.Float32, 2*n)
	var h16 *tensor.Tensor // P16, then DS16
	if dt == tensor.BFloat16 {
		h16 = s.alloc(tensor.BFloat16, 2*n)
	}
	if s.fail != nil {
		return s.fail
	}
	if err := p.do(func() error {
		return p.launch("attn_delta"+suffix(dt), rows, 0, ptx.BlockThreads,
			dev(delta), dev(do), dev(o), uint64(a.B), uint64(a.H), uint64(a.S), uint64(a.F))
	}); err != nil {
		return err
	}
	pp, ds := dev(sc), dev(sc)+uint64(4*n)
	var p16, ds16 uint64
	if h16 != nil {
		p16, ds16 = dev(h16), dev(h16)+uint64(2*n)
	}
	ops := newAttnOperands(dt)
	qp, kp, vp := attnViews(a, q, k, v)
	gq, gk, gv := attnViews(a, dq, dk, dv)
	for op, at := range map[ptx.Operand]uint64{ptx.OpQ: qp, ptx.OpK: kp, ptx.OpV: vp, ptx.OpDO: dev(do), ptx.OpP: pp, ptx.OpDS: ds,
		ptx.OpP16: p16, ptx.OpDS16: ds16, ptx.OpDQ: gq, ptx.OpDK: gk, ptx.OpDV: gv} {
		ops.at[op] = at
	}
	dpG, dvG, dqG, dkG := a.Backward()
	scale := float32(1 / math.Sqrt(float64(a.E)))
	return p.do(func() error {
		for b0 := 0; b0 < a.B; b0 += nb {
			c := min(nb, a.B-b0)
			if err := p.headGEMM(a, a.Scores(), ops, b0, c); err != nil {
				return err
			}
			if err := p.attnSoftmax(a, c, pp, p16, dev(lse)+uint64(4*b0*hs), 0, causal); err != nil {
				return err
			}
			for _, g := range []ptx.HeadGEMM{dpG, half(dvG, dt)} {
				if err := p.headGEMM(a, g, ops, b0, c); err != nil {
					return err
				}
			}
			if err := p.launch("attn_ds_f32", c*hs*a.T, 0, ptx.BlockThreads, ds, ds16, pp, dev(delta)+uint64(8*b0*hs),
				uint64(c*hs), uint64(a.T), uint64(math.Float32bits(scale))); err != nil {
				return err
			}
			for _, g := range []ptx.HeadGEMM{half(dqG, dt), half(dkG, dt)} {
				if err := p.headGEMM(a, g, ops, b0, c); err != nil {
					return err
				}
			}
		}
		return nil
	})
}
