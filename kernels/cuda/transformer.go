//go:build cuda

package cuda

import (
	"math"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cuda/ptx"
	"github.com/meshrun/meshrun/tensor"
)

// The transformer's ops on the GPU, as the kernels of ptx/kernels.h, for
// float32 and bfloat16 data (statistics, ids and targets in float32);
// float64 data, and attention heads wider than ptx.MaxHeadDim, go through
// the host, their copies counted.

// devOr0 is t's device address, or 0 for nil (an output not asked for).
func devOr0(t *tensor.Tensor) uint64 {
	if t == nil {
		return 0
	}
	return dev(t)
}

// embeddingGrad adds the gradient of n tokens' rows of dy into the float32
// table acc (a shard of rows × d from offset): in stages over chunks of
// tokens where their sums fit (ptx.EmbedChunks: emb_part, emb_sum), else
// one thread per column (embedding_grad).
func (p *Provider) embeddingGrad(acc, dy, ids *tensor.Tensor, offset, rows, d, n int) error {
	sfx := suffix(dy.DType())
	nk := ptx.EmbedChunks(n, rows, d)
	if nk == 0 {
		return p.do(func() error {
			return p.launch("embedding_grad"+sfx, d, 0, ptx.BlockThreads,
				dev(acc), dev(dy), dev(ids), signed(offset), uint64(rows), uint64(d), uint64(n))
		})
	}
	part, err := p.mem.Alloc(tensor.Float64, nk*rows*d)
	if err != nil {
		return err
	}
	defer p.freeAfter(part)
	chunk := (n + nk - 1) / nk
	nk = (n + chunk - 1) / chunk // the chunks emb_part makes of chunk tokens each
	return p.do(func() error {
		if err := p.launch("emb_part"+sfx, nk*d, 0, ptx.BlockThreads,
			dev(part), dev(dy), dev(ids), signed(offset), uint64(rows), uint64(d), uint64(n), uint64(chunk)); err != nil {
			return err
		}
		return p.launch("emb_sum", rows*d, 0, ptx.BlockThreads, dev(acc), dev(part), uint64(rows), uint64(d), uint64(nk))
	})
}

// signed passes an int64 kernel argument.
func signed(v int) uint64 { return uint64(int64(v)) }

// LayerNorm implements kernels.Kernels.
func (p *Provider) LayerNorm(y, stats, x, gamma, beta *tensor.Tensor, eps float64) error {
	if err := p.onDevice(y, stats, x, gamma, beta); err != nil {
		return err
	}
	rows, d, err := kernels.LayerNormDims(y, stats, x, gamma, beta)
	if err != nil {
		return err
	}
	if opPath(kernels.OpLayerNorm, x.DType(), x.DType(), false) == Host {
		return p.viaHost([]*tensor.Tensor{y, stats}, []*tensor.Tensor{x, gamma, beta}, func(h []*tensor.Tensor) error {
			return p.host.LayerNorm(h[0], h[1], h[2], h[3], h[4], eps)
		})
	}
	if rows == 0 {
		return nil
	}
	if p.opts.LayerNormBlock {
		return p.do(func() error {
			return p.launch("ln_block"+suffix(x.DType()), 0, rows, ptx.LayerNormThreads,
				dev(y), dev(stats), dev(x), dev(gamma), devOr0(beta), uint64(d), math.Float64bits(eps))
		})
	}
	// In stages (ptx's ln_*): the rows' sums by segments of lnSeg columns,
	// the means, the centred squares likewise, the statistics, then y one
	// thread per element.
	ns := (d + lnSeg - 1) / lnSeg
	part, err := p.mem.Alloc(tensor.Float64, rows*ns+rows)
	if err != nil {
		return err
	}
	defer p.freeAfter(part)
	mean := dev(part) + uint64(8*rows*ns)
	sfx := suffix(x.DType())
	return p.do(func() error {
		for _, pass := range []uint64{0, mean} {
			if err := p.launch("ln_part"+sfx, rows*ns, 0, ptx.BlockThreads, dev(part), dev(x), pass, uint64(rows), uint64(d), lnSeg); err != nil {
				return err
			}
			if err := p.launch("ln_row", rows, 0, ptx.BlockThreads, mean, dev(stats), dev(part), uint64(rows), uint64(d), uint64(ns),
				uint64(int(betaIf(pass != 0))), math.Float64bits(eps)); err != nil {
				return err
			}
		}
		return p.launch("ln_apply"+sfx, rows*d, 0, ptx.BlockThreads, dev(y), dev(stats), dev(x), dev(gamma), devOr0(beta), uint64(rows), uint64(d))
	})
}

// lnSeg and lnChunk are the layer norm's slices: columns per partial sum
// of a row, rows per partial sum of a column.
const lnSeg, lnChunk = 64, 64

// LayerNormBackward implements kernels.Kernels.
func (p *Provider) LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats *tensor.Tensor, accumulate bool) error {
	if err := p.onDevice(dx, dgamma, dbeta, dy, x, gamma, stats); err != nil {
		return err
	}
	rows, d, err := kernels.LayerNormBackwardDims(dx, dgamma, dbeta, dy, x, gamma, stats)
	if err != nil {
		return err
	}
	if opPath(kernels.OpLayerNormBackward, x.DType(), x.DType(), false) == Host {
		return p.viaHost([]*tensor.Tensor{dx, dgamma, dbeta}, []*tensor.Tensor{dy, x, gamma, stats}, func(h []*tensor.Tensor) error {
			return p.host.LayerNormBackward(h[0], h[1], h[2], h[3], h[4], h[5], h[6], accumulate)
		})
	}
	// In stages (ptx's ln_*): dx from each row's sums by segments of lnSeg
	// columns, dgamma and dbeta from each column's by chunks of lnChunk rows.
	sfx := suffix(x.DType())
	ns, nc := (d+lnSeg-1)/lnSeg, (rows+lnChunk-1)/lnChunk
	part, err := p.mem.Alloc(tensor.Float64, max(2*rows*ns, 2*nc*d, 1))
	if err != nil {
		return err
	}
	defer p.freeAfter(part)
	return p.do(func() error {
		if dx != nil && rows > 0 && d > 0 && p.opts.LayerNormBlock {
			if err := p.launch("ln_dx_block"+sfx, 0, rows, ptx.LayerNormThreads,
				dev(dx), dev(dy), dev(x), dev(gamma), dev(stats), uint64(d)); err != nil {
				return err
			}
		} else if dx != nil && rows > 0 && d > 0 {
			if err := p.launch("ln_dx_part"+sfx, rows*ns, 0, ptx.BlockThreads,
				dev(part), dev(dy), dev(x), dev(gamma), dev(stats), uint64(rows), uint64(d), lnSeg); err != nil {
				return err
			}
			if err := p.launch("ln_dx_apply"+sfx, rows*d, 0, ptx.BlockThreads,
				dev(dx), dev(dy), dev(x), dev(gamma), dev(stats), dev(part), uint64(rows), uint64(d), uint64(ns)); err != nil {
				return err
			}
		}
		if dgamma == nil && dbeta == nil || d == 0 {
			return nil
		}
		if err := p.launch("ln_dgb_part"+sfx, nc*d, 0, ptx.BlockThreads,
			dev(part), dev(dy), dev(x), dev(stats), uint64(rows), uint64(d), lnChunk); err != nil {
			return err
		}
		return p.launch("ln_dgb_sum"+sfx, d, 0, ptx.BlockThreads,
			devOr0(dgamma), devOr0(dbeta), dev(part), uint64(nc), uint64(d), uint64(int(betaIf(accumulate))))
	})
}

// Embedding implements kernels.Kernels: one thread per element of y.
func (p *Provider) Embedding(y, ids, table *tensor.Tensor, offset int) error {
	if err := p.onDevice(y, ids, table); err != nil {
		return err
	}
	n, rows, d, err := kernels.EmbeddingDims(y, ids, table)
	if err != nil {
		return err
	}
	if opPath(kernels.OpEmbedding, y.DType(), y.DType(), false) == Host {
		return p.viaHost([]*tensor.Tensor{y}, []*tensor.Tensor{ids, table}, func(h []*tensor.Tensor) error {
			return p.host.Embedding(h[0], h[1], h[2], offset)
		})
	}
	if n*d == 0 {
		return nil
	}
	return p.do(func() error {
		return p.launch("embedding"+suffix(y.DType()), n*d, 0, ptx.BlockThreads,
			dev(y), dev(ids), dev(table), signed(offset), uint64(rows), uint64(d), uint64(n))
	})
}

// EmbeddingBackward implements kernels.Kernels: one thread per column adds
// the rows of dy into a float32 table (a bfloat16 one is widened into a
// scratch table first and narrowed after, rounded once).
func (p *Provider) EmbeddingBackward(dtable, dy, ids *tensor.Tensor, offset int, accumulate bool) error {
	if err := p.onDevice(dtable, dy, ids); err != nil {
		return err
	}
	n, rows, d, err := kernels.EmbeddingDims(dy, ids, dtable)
	if err != nil {
		return err
	}
	if opPath(kernels.OpEmbeddingBackward, dtable.DType(), dtable.DType(), false) == Host {
		return p.viaHost([]*tensor.Tensor{dtable}, []*tensor.Tensor{dy, ids}, func(h []*tensor.Tensor) error {
			return p.host.EmbeddingBackward(h[0], h[1], h[2], offset, accumulate)
		})
	}
	acc := dtable
	if dtable.DType() == tensor.BFloat16 {
		if acc, err = p.mem.Alloc(tensor.Float32, rows, d); err != nil {
			return err
		}
		defer p.freeAfter(acc)
		if accumulate {
			if err := p.Cast(acc, dtable); err != nil {
				return err
			}
		}
	} else if !accumulate {
		if err := p.mem.Zero(acc, 0, acc.Bytes()); err != nil {
			return err
		}
	}
	if n > 0 && d > 0 {
		if err := p.embeddingGrad(acc, dy, ids, offset, rows, d, n); err != nil {
			return err
		}
	}
	if acc != dtable {
		return p.Cast(dtable, acc)
	}
	return nil
}

// freeAfter frees a scratch tensor (Free waits for the work queued on it).
func (p *Provider) freeAfter(t *tensor.Tensor) { p.mem.Free(t) }

// CrossEntropy implements kernels.Kernels: one thread per row.
func (p *Provider) CrossEntropy(stats, logits, targets *tensor.Tensor, offset int) error {
	if err := p.onDevice(stats, logits, targets); err != nil {
		return err
	}
	t, v, err := kernels.CrossEntropyDims(stats, logits, targets, 3)
	if err != nil {
		return err
	}
	if opPath(kernels.OpCrossEntropy, logits.DType(), logits.DType(), false) == Host {
		return p.viaHost([]*tensor.Tensor{stats}, []*tensor.Tensor{logits, targets}, func(h []*tensor.Tensor) error {
			return p.host.CrossEntropy(h[0], h[1], h[2], offset)
		})
	}
	if t == 0 {
		return nil
	}
	return p.do(func() error {
		return p.launch("cross_entropy"+suffix(logits.DType()), t, 0, ptx.BlockThreads,
			dev(stats), dev(logits), dev(targets), signed(offset), uint64(v), uint64(t))
	})
}

// CrossEntropyBackward implements kernels.Kernels: one thread per logit.
func (p *Provider) CrossEntropyBackward(dlogits, logits, targets, lse *tensor.Tensor, offset int, scale float64) error {
	if err := p.onDevice(dlogits, logits, targets, lse); err != nil {
		return err
	}
	t, v, err := kernels.CrossEntropyBackwardDims(dlogits, logits, targets, lse)
	if err != nil {
		return err
	}
	if opPath(kernels.OpCrossEntropyBackward, logits.DType(), logits.DType(), false) == Host {
		return p.viaHost([]*tensor.Tensor{dlogits}, []*tensor.Tensor{logits, targets, lse}, func(h []*tensor.Tensor) error {
			return p.host.CrossEntropyBackward(h[0], h[1], h[2], h[3], offset, scale)
		})
	}
	if t*v == 0 {
		return nil
	}
	return p.do(func() error {
		return p.launch("cross_entropy_grad"+suffix(logits.DType()), t*v, 0, ptx.BlockThreads,
			dev(dlogits), dev(logits), dev(targets), dev(lse), signed(offset), uint64(v), uint64(t), math.Float64bits(scale))
	})
}

// CrossEntropyCombine implements kernels.Kernels: each row's log-sum-exp
// and loss term (one thread per row), then the loss summed in row order
// (one thread), in float64.
func (p *Provider) CrossEntropyCombine(lse, loss, stats *tensor.Tensor) error {
	if err := p.onDevice(lse, loss, stats); err != nil {
		return err
	}
	parts, rows, err := kernels.CombineDims(lse, loss, stats)
	if err != nil {
		return err
	}
	if opPath(kernels.OpCrossEntropyCombine, lse.DType(), lse.DType(), false) == Host {
		return p.viaHost([]*tensor.Tensor{lse, loss}, []*tensor.Tensor{stats}, func(h []*tensor.Tensor) error {
			return p.host.CrossEntropyCombine(h[0], h[1], h[2])
		})
	}
	part, err := p.mem.Alloc(tensor.Float64, max(rows, 1))
	if err != nil {
		return err
	}
	defer p.freeAfter(part)
	return p.do(func() error {
		if rows > 0 {
			if err := p.launch("cross_entropy_combine", rows, 0, ptx.BlockThreads,
				dev(lse), dev(part), dev(stats), uint64(parts), uint64(rows)); err != nil {
				return err
			}
		}
		return p.launch("sum_rows", 1, 1, 1, dev(loss), dev(part), uint64(rows))
	})
}

// AdamW implements kernels.Kernels: PyTorch's step, one thread per element.
func (p *Provider) AdamW(a kernels.AdamWParams, param, grad, m, v *tensor.Tensor) error {
	if err := p.onDevice(param, grad, m, v); err != nil {
		return err
	}
	n, err := kernels.AdamWDims(a, param, grad, m, v)
	if err != nil || n == 0 {
		return err
	}
	k := a.Scalars()
	args := []uint64{dev(param), dev(grad), dev(m), dev(v), uint64(n)}
	for _, f := range []float32{k.Decay, k.Step, k.Root, k.Eps, k.W1, k.B2} {
		args = append(args, uint64(math.Float32bits(f)))
	}
	return p.do(func() error { return p.launch("adamw_f32", n, 0, ptx.BlockThreads, args...) })
}

// attnViews are the device addresses of q, k and v (or their gradients):
// three views of a packed qkv.
func attnViews(a ptx.Attn, q, k, v *tensor.Tensor) (uint64, uint64, uint64) {
	if a.Packed {
		es := uint64(q.DType().Size())
		return dev(q), dev(q) + uint64(a.KOff)*es, dev(q) + uint64(a.VOff)*es
	}
	return dev(q), dev(k), dev(v)
}

// Attention implements kernels.Kernels: one thread per query row, the
// scores recomputed in two passes (the row's log-sum-exp, then P·v).
func (p *Provider) Attention(o, lse, q, k, v *tensor.Tensor, causal bool) error {
	if err := p.onDevice(o, lse, q, k, v); err != nil {
		return err
	}
	a, err := ptx.AttnShape(o, lse, q, k, v)
	if err != nil {
		return err
	}
	if opPath(kernels.OpAttention, q.DType(), q.DType(), wide(a)) == Host {
		return p.viaHost([]*tensor.Tensor{o, lse}, []*tensor.Tensor{q, k, v}, func(h []*tensor.Tensor) error {
			return p.host.Attention(h[0], h[1], h[2], h[3], h[4], causal)
		})
	}
	rows := a.B * a.H * a.S
	if rows == 0 {
		return nil
	}
	fused := p.attnFused(a)
	if !fused && p.attnGEMM(a, q.DType(), false) {
		return p.attentionGEMM(a, o, lse, q, k, v, causal)
	}
	qp, kp, vp := attnViews(a, q, k, v)
	args := append([]uint64{dev(o), dev(lse), qp, kp, vp}, a.Args()...)
	args = append(args, uint64(int(betaIf(causal))))
	if fused {
		blocks, _, _ := a.FlashBlocks()
		return p.do(func() error { return p.launch("attn_flash_fwd"+suffix(q.DType()), 0, blocks, ptx.FlashQ, args...) })
	}
	return p.do(func() error { return p.launch("attn_fwd"+suffix(q.DType()), rows, 0, ptx.BlockThreads, args...) })
}

// AttentionBackward implements kernels.Kernels: each query row's
// Σ do·o, then dq one thread per query row, dk and dv one thread per key
// row, the probabilities recomputed from lse.
func (p *Provider) AttentionBackward(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool) error {
	if err := p.onDevice(dq, dk, dv, do, q, k, v, o, lse); err != nil {
		return err
	}
	if _, _, _, _, _, _, err := kernels.AttentionBackwardDims(dq, dk, dv, do, q, k, v, o, lse); err != nil {
		return err
	}
	a, err := ptx.AttnShape(o, lse, q, k, v)
	if err != nil {
		return err
	}
	if opPath(kernels.OpAttentionBackward, q.DType(), q.DType(), wide(a)) == Host {
		return p.viaHost([]*tensor.Tensor{dq, dk, dv}, []*tensor.Tensor{do, q, k, v, o, lse}, func(h []*tensor.Tensor) error {
			return p.host.AttentionBackward(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], causal)
		})
	}
	rows := a.B * a.H * a.S
	if rows == 0 || a.T == 0 {
		return nil
	}
	fused := p.attnFused(a)
	if !fused && p.attnGEMM(a, q.DType(), true) {
		return p.attentionBackwardGEMM(a, dq, dk, dv, do, q, k, v, o, lse, causal)
	}
	delta, err := p.mem.Alloc(tensor.Float64, rows)
	if err != nil {
		return err
	}
	defer p.freeAfter(delta)
	sfx, c := suffix(q.DType()), uint64(int(betaIf(causal)))
	qp, kp, vp := attnViews(a, q, k, v)
	gq, gk, gv := attnViews(a, dq, dk, dv)
	shape := a.Args()
	return p.do(func() error {
		if err := p.launch("attn_delta"+sfx, rows, 0, ptx.BlockThreads,
			dev(delta), dev(do), dev(o), uint64(a.B), uint64(a.H), uint64(a.S), uint64(a.F)); err != nil {
			return err
		}
		common := append(append([]uint64{dev(do), qp, kp, vp, dev(lse), dev(delta)}, shape...), c)
		if fused {
			_, bq, bk := a.FlashBlocks()
			if err := p.launch("attn_flash_dq"+sfx, 0, bq, ptx.FlashRows, append([]uint64{gq}, common...)...); err != nil {
				return err
			}
			return p.launch("attn_flash_dkv"+sfx, 0, bk, ptx.FlashRows, append([]uint64{gk, gv}, common...)...)
		}
		if err := p.launch("attn_dq"+sfx, rows, 0, ptx.BlockThreads, append([]uint64{gq}, common...)...); err != nil {
			return err
		}
		return p.launch("attn_dkv"+sfx, a.B*a.H*a.T, 0, ptx.BlockThreads, append([]uint64{gk, gv}, common...)...)
	})
}
