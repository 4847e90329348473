package models

import (
	"context"
	"fmt"

	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/tensor"
)

// backward runs the model's backward from the loss of the forward that made
// acts: the layers accumulate their parameters' gradients (reduced by
// update), the model's own parameters' gradients are written in place.
func (g *GPT) backward(ctx context.Context, rt linear.Runtime, ids, targets *tensor.Tensor, acts *gptActs) error {
	_, err := g.backwardPart(ctx, rt, ids, targets, acts, nil)
	return err
}

// backwardPart runs the backward of the model's part from the forward that
// made acts: from the loss on the last stage, else from dout, the gradient
// of the residual stream the part returned; through its blocks; into the
// embeddings on the first stage, else to the gradient of the stream it
// started from, which it returns. The model's own parameters' gradients are
// overwritten, or added to with g.accum (the micro-batches after a step's
// first).
func (g *GPT) backwardPart(ctx context.Context, rt linear.Runtime, ids, targets *tensor.Tensor, acts *gptActs, dout *tensor.Tensor) (*tensor.Tensor, error) {
	dx, err := g.grad(rt, "dx", acts.xf.Shape()...)
	if err != nil {
		return nil, err
	}
	tmp, err := g.work.Get(rt.Kernels, "dln", g.Cfg.Compute(), acts.xf.Shape()) // each use ends at the Axpy after it
	if err != nil {
		return nil, err
	}
	if g.Cfg.last() {
		dl, err := g.grad(rt, "ce.dlogits", acts.logits.Shape()...)
		if err != nil {
			return nil, err
		}
		if err := rt.Op("cross_entropy_backward", func() error {
			return rt.Kernels.CrossEntropyBackward(dl, acts.logits, targets, acts.lse, g.vocab0, 1/float64(g.Cfg.lossTokens()))
		}); err != nil {
			return nil, err
		}
		dhf, err := g.linearBackward(ctx, rt, g.head, dl, acts.headS, true)
		if err != nil {
			return nil, err
		}
		acts.dhf = dhf
		if err := g.layerNormBackward(rt, dx, g.lnf, dhf, acts.xf, acts.stf); err != nil {
			return nil, err
		}
	} else if n := dout.Bytes(); n > 0 {
		if err := rt.Kernels.Copy2D(dx, 0, n, dout, 0, n, n, 1); err != nil {
			return nil, err
		}
	}
	for j := len(g.blocks) - 1; j >= 0; j-- {
		if err := g.blockBackward(ctx, rt, j, &acts.blocks[j], dx, tmp); err != nil {
			return nil, err
		}
	}
	acts.dx = dx
	if !g.Cfg.first() {
		return dx, nil
	}
	if g.splitB {
		return nil, nil // the embeddings' gradients are weightPart's
	}
	return nil, g.embeddingBackward(ctx, rt, ids, dx)
}

// linearBackward is l's backward from dy: whole, or with g.splitB its
// input gradient alone (weightPart adds the weight gradients; stable: dy
// stays as it is until then, else the layer keeps a copy: the residual
// stream's gradient changes in place).
func (g *GPT) linearBackward(ctx context.Context, rt linear.Runtime, l *linear.Layer, dy *tensor.Tensor, s *linear.Saved, stable bool) (*tensor.Tensor, error) {
	if g.splitB {
		return l.BackwardInput(ctx, rt, dy, s, stable)
	}
	return l.Backward(ctx, rt, dy, s)
}

// weightPart is the second half of a split backward (g.splitB) of the
// forward that made acts: the part's parameters' gradients, from what the
// first half kept (each layer's dy, each layer norm's dy, the residual
// stream's gradient for the embeddings).
func (g *GPT) weightPart(ctx context.Context, rt linear.Runtime, ids *tensor.Tensor, acts *gptActs) error {
	norm := func(p lnParams, dy, x, stats *tensor.Tensor) error {
		return rt.Op("layernorm_backward", func() error {
			return rt.Kernels.LayerNormBackward(nil, p.gamma.grad(), p.beta.grad(), dy, x, p.gamma.compute(), stats, g.accum)
		})
	}
	if g.Cfg.last() {
		if err := g.head.BackwardWeight(ctx, rt, acts.headS); err != nil {
			return err
		}
		if err := norm(g.lnf, acts.dhf, acts.xf, acts.stf); err != nil {
			return err
		}
	}
	for j := len(g.blocks) - 1; j >= 0; j-- {
		b, a := g.blocks[j], &acts.blocks[j]
		for _, l := range []struct {
			l *linear.Layer
			s *linear.Saved
		}{{b.down, a.downS}, {b.up, a.upS}, {b.proj, a.projS}, {b.qkv, a.qkvS}} {
			if l.l == nil { // the MLP of experts: its backward is whole, in the first half
				continue
			}
			if err := l.l.BackwardWeight(ctx, rt, l.s); err != nil {
				return err
			}
		}
		if err := norm(b.ln2, a.dh2, a.x2, a.st2); err != nil {
			return err
		}
		if err := norm(b.ln1, a.dh1, a.x, a.st1); err != nil {
			return err
		}
	}
	if !g.Cfg.first() {
		return nil
	}
	return g.embeddingBackward(ctx, rt, ids, acts.dx)
}

// layerNormBackward writes the gradient of the layer norm's input x into
// into, and p's gradients (overwritten, not accumulated: each layer norm's
// parameters are used once a step), from dy.
func (g *GPT) layerNormBackward(rt linear.Runtime, into *tensor.Tensor, p lnParams, dy, x, stats *tensor.Tensor) error {
	dgamma, dbeta := p.gamma.grad(), p.beta.grad()
	if g.splitB {
		dgamma, dbeta = nil, nil // weightPart's
	}
	return rt.Op("layernorm_backward", func() error {
		return rt.Kernels.LayerNormBackward(into, dgamma, dbeta, dy, x, p.gamma.compute(), stats, g.accum)
	})
}

// blockBackward runs the backward of the part's block j: dx, the gradient
// of the block's output, becomes in place the gradient of its input (each
// residual adds its branch's input gradient, computed into tmp).
func (g *GPT) blockBackward(ctx context.Context, rt linear.Runtime, j int, a *blockActs, dx, tmp *tensor.Tensor) error {
	c := g.Cfg
	hl, hd := c.Heads/c.TP(), c.Dim/c.Heads
	b := g.blocks[j]
	i := b.index
	dh2, err := g.mlpBackward(ctx, rt, i, b, *a, dx)
	if err != nil {
		return err
	}
	a.dh2 = dh2
	if err := g.layerNormBackward(rt, tmp, b.ln2, dh2, a.x2, a.st2); err != nil {
		return err
	}
	if err := rt.Kernels.Axpy(1, tmp, dx); err != nil {
		return err
	}
	do, err := g.linearBackward(ctx, rt, b.proj, dx, a.projS, false)
	if err != nil {
		return err
	}
	if do, err = do.Reshape(c.localBatch(), c.localContext(), hl, hd); err != nil {
		return err
	}
	dqkv, err := g.grad(rt, fmt.Sprintf("h%d.dqkv", i), a.qkv.Shape()...)
	if err != nil {
		return err
	}
	if c.CP() > 1 {
		if err := g.ringBackward(ctx, rt, b, dqkv, do); err != nil {
			return fmt.Errorf("gpt: block %d: %w", i, err)
		}
	} else if err := rt.Op("attention_backward", func() error {
		return rt.Kernels.AttentionBackward(dqkv, nil, nil, do, a.qkv, nil, nil, a.o, a.lse, true)
	}); err != nil {
		return err
	}
	flat, err := dqkv.Reshape(c.localTokens(), 3*hl*hd)
	if err != nil {
		return err
	}
	dh1, err := g.linearBackward(ctx, rt, b.qkv, flat, a.qkvS, true)
	if err != nil {
		return err
	}
	a.dh1 = dh1
	if err := g.layerNormBackward(rt, tmp, b.ln1, dh1, a.x, a.st1); err != nil {
		return err
	}
	return rt.Kernels.Axpy(1, tmp, dx)
}

// mlpBackward runs the backward of block i's MLP (or mixture of experts)
// from dx, the gradient of the block's output, and returns the gradient of
// its input, ln2's output.
func (g *GPT) mlpBackward(ctx context.Context, rt linear.Runtime, i int, b *gptBlock, a blockActs, dx *tensor.Tensor) (*tensor.Tensor, error) {
	if b.moe != nil {
		return b.moe.Backward(ctx, rt.World, dx)
	}
	dg, err := g.linearBackward(ctx, rt, b.down, dx, a.downS, false)
	if err != nil {
		return nil, err
	}
	du, err := g.grad(rt, fmt.Sprintf("h%d.du", i), dg.Shape()...)
	if err != nil {
		return nil, err
	}
	if err := rt.Op("gelu_backward", func() error { return rt.Kernels.GeluBackward(du, dg, a.u) }); err != nil {
		return nil, err
	}
	return g.linearBackward(ctx, rt, b.up, du, a.upS, true)
}

// embeddingBackward writes the embeddings' gradients from dx, the gradient
// of the residual stream's input.
func (g *GPT) embeddingBackward(ctx context.Context, rt linear.Runtime, ids, dx *tensor.Tensor) error {
	var err error
	if g.Cfg.SequenceParallel {
		// Each rank's rows of the input's gradient: gathered, every token's
		// gradient goes into the embeddings (each rank's vocabulary rows).
		if dx, err = linear.Execute(ctx, rt, "gpt", "dx_embedding", g.dxMove, dx, g.rank, g.bufs, "backward"); err != nil {
			return err
		}
	}
	if dx.DType() != tensor.Float32 { // the embeddings' gradients are float32
		d32, err := g.get(rt, "dx32", dx.Shape()...)
		if err != nil {
			return err
		}
		if err := rt.Kernels.Cast(d32, dx); err != nil {
			return err
		}
		dx = d32
	}
	if err := rt.Op("embedding_backward", func() error {
		return rt.Kernels.EmbeddingBackward(g.wpe.g, dx, g.posIDs, 0, g.accum)
	}); err != nil {
		return err
	}
	// dx is whole on every rank: each scatters into its own vocabulary rows.
	return rt.Op("embedding_backward", func() error {
		return rt.Kernels.EmbeddingBackward(g.wte.g, dx, ids, g.vocab0, g.accum)
	})
}
