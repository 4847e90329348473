package models

import (
	"context"
	"fmt"
	"math"

	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// blockActs is what one block's forward keeps for its backward.
type blockActs struct {
	x, x2, st1, st2, qkv, o, lse, u *tensor.Tensor
	qkvS, projS, upS, downS         *linear.Saved
	// dh1, dh2: the layer norms' output gradients, kept by the backward
	// for a split backward's weight half.
	dh1, dh2 *tensor.Tensor
}

// gptActs is what the forward keeps for the backward: each block's, and
// the head's and the loss's.
type gptActs struct {
	blocks      []blockActs
	xf, stf, hf *tensor.Tensor
	logits, lse *tensor.Tensor
	headS       *linear.Saved
	// dhf and dx: the final layer norm's output gradient and the residual
	// stream's input gradient, kept by the backward for its weight half.
	dhf, dx *tensor.Tensor
}

// get is a float32 scratch tensor (statistics, ids, float32 gradients).
func (g *GPT) get(rt linear.Runtime, name string, shape ...int) (*tensor.Tensor, error) {
	return g.bufs.Get(rt.Kernels, name, tensor.Float32, shape)
}

// act is a scratch tensor in the compute dtype (activations and their
// gradients).
func (g *GPT) act(rt linear.Runtime, name string, shape ...int) (*tensor.Tensor, error) {
	return g.bufs.Get(rt.Kernels, name, g.Cfg.Compute(), shape)
}

// grad is a backward's scratch tensor in the compute dtype: kept for the
// weight half of a split backward (g.splitB: in the micro-batch's bufs),
// else in the workspace the micro-batches share (gone with the backward).
func (g *GPT) grad(rt linear.Runtime, name string, shape ...int) (*tensor.Tensor, error) {
	if g.splitB {
		return g.act(rt, name, shape...)
	}
	return g.work.Get(rt.Kernels, name, g.Cfg.Compute(), shape)
}

// layerNorm runs x's layer norm into scratch name (and its stats).
func (g *GPT) layerNorm(rt linear.Runtime, name string, x *tensor.Tensor, p lnParams) (y, stats *tensor.Tensor, err error) {
	t, d := x.Dim(0), x.Dim(1)
	if y, err = g.act(rt, name, t, d); err != nil {
		return nil, nil, err
	}
	if stats, err = g.get(rt, name+".stats", t, 2); err != nil {
		return nil, nil, err
	}
	err = rt.Op("layernorm", func() error { return rt.Kernels.LayerNorm(y, stats, x, p.gamma.compute(), p.beta.compute(), gptEps) })
	return y, stats, err
}

// gptEps is the layer norms' epsilon (PyTorch's default).
const gptEps = 1e-5

// residual returns a copy of x in scratch name with d added.
func (g *GPT) residual(rt linear.Runtime, name string, x, d *tensor.Tensor) (*tensor.Tensor, error) {
	y, err := g.bufs.CopyOf(name, x)
	if err != nil {
		return nil, err
	}
	return y, rt.Kernels.Axpy(1, d, y)
}

// forward runs the model on ids and returns the mean cross-entropy loss
// against targets, with what the backward needs.
func (g *GPT) forward(ctx context.Context, rt linear.Runtime, ids, targets *tensor.Tensor) (float64, *gptActs, error) {
	loss, _, acts, err := g.forwardPart(ctx, rt, ids, targets, nil)
	return loss, acts, err
}

// forwardPart runs the model's part (all of it without a pipeline): from
// the embeddings of ids on the first stage, else from in, the previous
// stage's residual stream, through its blocks, to the loss against targets
// on the last stage (its share of the step's mean, lossTokens), else to the
// residual stream it returns for the next stage.
func (g *GPT) forwardPart(ctx context.Context, rt linear.Runtime, ids, targets, in *tensor.Tensor) (float64, *tensor.Tensor, *gptActs, error) {
	x := in
	var err error
	if g.Cfg.first() {
		if x, err = g.embed(ctx, rt, ids); err != nil {
			return 0, nil, nil, err
		}
	}
	acts := &gptActs{}
	for _, b := range g.blocks {
		a, y, err := g.blockForward(ctx, rt, b.index, b, x)
		if err != nil {
			return 0, nil, nil, err
		}
		acts.blocks = append(acts.blocks, a)
		x = y
	}
	acts.xf = x
	if !g.Cfg.last() {
		return 0, x, acts, nil
	}
	if acts.hf, acts.stf, err = g.layerNorm(rt, "lnf", x, g.lnf); err != nil {
		return 0, nil, nil, err
	}
	if acts.logits, acts.headS, err = g.head.Forward(ctx, rt, acts.hf); err != nil {
		return 0, nil, nil, err
	}
	loss, err := g.crossEntropy(ctx, rt, acts, targets)
	if err != nil {
		return 0, nil, nil, err
	}
	return loss, nil, acts, nil
}

// embed returns the residual stream's input: the token embeddings of ids
// (each rank looks up its vocabulary rows; the partial sums are moved to
// the stream's layout) plus the position embeddings of the rows it holds.
func (g *GPT) embed(ctx context.Context, rt linear.Runtime, ids *tensor.Tensor) (*tensor.Tensor, error) {
	c := g.Cfg
	emb, err := g.act(rt, "emb", c.localTokens(), c.Dim)
	if err != nil {
		return nil, err
	}
	if err := rt.Op("embedding", func() error { return rt.Kernels.Embedding(emb, ids, g.wte.compute(), g.vocab0) }); err != nil {
		return nil, err
	}
	x, err := linear.Execute(ctx, rt, "gpt", "embedding", g.embMove, emb, g.rank, g.bufs, "forward")
	if err != nil {
		return nil, err
	}
	pos, err := g.act(rt, "pos", x.Shape()...)
	if err != nil {
		return nil, err
	}
	if err := rt.Kernels.Embedding(pos, g.posLocal, g.wpe.compute(), 0); err != nil {
		return nil, err
	}
	if err := rt.Kernels.Axpy(1, pos, x); err != nil {
		return nil, err
	}
	return x, nil
}

// blockForward runs block i (b) on the residual stream x: x2 = x +
// proj(attention(qkv(ln1(x)))), then x2 + down(gelu(up(ln2(x2)))), which
// it returns with what the block's backward needs.
func (g *GPT) blockForward(ctx context.Context, rt linear.Runtime, i int, b *gptBlock, x *tensor.Tensor) (blockActs, *tensor.Tensor, error) {
	c := g.Cfg
	t := c.localTokens()
	hl, hd := c.Heads/c.TP(), c.Dim/c.Heads
	a := blockActs{x: x}
	name := fmt.Sprintf("h%d.", i)
	h1, st1, err := g.layerNorm(rt, name+"ln1", x, b.ln1)
	if err != nil {
		return blockActs{}, nil, err
	}
	a.st1 = st1
	qkv, qs, err := b.qkv.Forward(ctx, rt, h1)
	if err != nil {
		return blockActs{}, nil, err
	}
	a.qkvS = qs
	sl := c.localContext()
	if a.qkv, err = qkv.Reshape(c.localBatch(), sl, hl, 3, hd); err != nil {
		return blockActs{}, nil, err
	}
	if a.o, err = g.act(rt, name+"o", c.localBatch(), sl, hl, hd); err != nil {
		return blockActs{}, nil, err
	}
	if c.CP() > 1 {
		// The rank's positions of every sequence: ring attention over cp.
		if err := g.ringForward(ctx, rt, b, a.qkv, a.o); err != nil {
			return blockActs{}, nil, fmt.Errorf("gpt: block %d: %w", i, err)
		}
	} else {
		if a.lse, err = g.get(rt, name+"lse", c.localBatch(), hl, c.Context); err != nil {
			return blockActs{}, nil, err
		}
		if err := rt.Op("attention", func() error { return rt.Kernels.Attention(a.o, a.lse, a.qkv, nil, nil, true) }); err != nil {
			return blockActs{}, nil, err
		}
	}
	o2, err := a.o.Reshape(t, hl*hd)
	if err != nil {
		return blockActs{}, nil, err
	}
	p, ps, err := b.proj.Forward(ctx, rt, o2)
	if err != nil {
		return blockActs{}, nil, err
	}
	a.projS = ps
	if a.x2, err = g.residual(rt, name+"x2", x, p); err != nil {
		return blockActs{}, nil, err
	}
	h2, st2, err := g.layerNorm(rt, name+"ln2", a.x2, b.ln2)
	if err != nil {
		return blockActs{}, nil, err
	}
	a.st2 = st2
	if b.moe != nil {
		y, err := g.expertsForward(ctx, rt, i, b, a.x2, h2)
		return a, y, err
	}
	u, us, err := b.up.Forward(ctx, rt, h2)
	if err != nil {
		return blockActs{}, nil, err
	}
	a.u, a.upS = u, us
	gl, err := g.act(rt, name+"gelu", u.Shape()...)
	if err != nil {
		return blockActs{}, nil, err
	}
	if err := rt.Op("gelu", func() error { return rt.Kernels.GeluForward(gl, u) }); err != nil {
		return blockActs{}, nil, err
	}
	dn, ds, err := b.down.Forward(ctx, rt, gl)
	if err != nil {
		return blockActs{}, nil, err
	}
	a.downS = ds
	y, err := g.residual(rt, name+"x3", a.x2, dn)
	if err != nil {
		return blockActs{}, nil, err
	}
	return a, y, nil
}

// crossEntropy returns the mean loss of acts.logits (this rank's
// vocabulary shard) against targets, the same on every rank: each rank's
// max, sum of exponentials and target logit per token are all-gathered and
// combined, never the logits. It keeps each token's log-sum-exp in acts
// for the backward.
func (g *GPT) crossEntropy(ctx context.Context, rt linear.Runtime, acts *gptActs, targets *tensor.Tensor) (float64, error) {
	t := g.Cfg.localTokens()
	stats, err := g.get(rt, "ce.stats", t, 3)
	if err != nil {
		return 0, err
	}
	if err := rt.Op("cross_entropy", func() error { return rt.Kernels.CrossEntropy(stats, acts.logits, targets, g.vocab0) }); err != nil {
		return 0, err
	}
	all, err := linear.Execute(ctx, rt, "gpt", "ce_stats", g.ceMove, stats, g.rank, g.bufs, "forward")
	if err != nil {
		return 0, err
	}
	if all, err = all.Reshape(g.Cfg.TP(), t, 3); err != nil {
		return 0, err
	}
	if acts.lse, err = g.get(rt, "ce.lse", t); err != nil {
		return 0, err
	}
	sum, err := g.bufs.Get(rt.Kernels, "ce.sum", tensor.Float64, []int{1})
	if err != nil {
		return 0, err
	}
	if err := rt.Kernels.CrossEntropyCombine(acts.lse, sum, all); err != nil {
		return 0, err
	}
	host, err := tensor.Download(sum)
	if err != nil {
		return 0, err
	}
	total := host.Float64()[0]
	if g.Cfg.split() > 1 {
		// Each ep (dp, cp) rank's tokens' sum: the loss is the mean over the
		// batch.
		if total, err = g.sumOverSplit(ctx, rt, total); err != nil {
			return 0, err
		}
	}
	return total / float64(g.Cfg.lossTokens()), nil
}

// Next returns the model's distribution of the token after position pos of
// the first sequence in ids (the forward of a whole step's batch; the rows
// after pos do not matter: attention is causal), softmax(logits/temp), the
// same on every rank: the row's vocabulary shards are all-gathered (under cp
// from the cp rank that holds pos).
func (g *GPT) Next(ctx context.Context, rt linear.Runtime, ids *tensor.Tensor, pos int, temp float64) ([]float64, error) {
	_, p, err := g.next(ctx, rt, ids, nil, pos, temp)
	return p, err
}

// next is Next on the model's part: from ids (first stage) or in, it
// returns the residual stream for the next stage, or on the last stage the
// distribution.
func (g *GPT) next(ctx context.Context, rt linear.Runtime, ids, in *tensor.Tensor, pos int, temp float64) (*tensor.Tensor, []float64, error) {
	c := g.Cfg
	if pos < 0 || pos >= c.Context {
		return nil, nil, fmt.Errorf("%w: gpt: position %d outside the context of %d", linear.ErrConfig, pos, c.Context)
	}
	zeros, err := g.get(rt, "next.targets", c.localTokens())
	if err != nil {
		return nil, nil, err
	}
	if ids != nil {
		if ids, err = g.localRows(rt, "next.ids", ids); err != nil {
			return nil, nil, err
		}
	}
	_, out, acts, err := g.forwardPart(ctx, rt, ids, zeros, in)
	if err != nil || out != nil {
		return out, nil, err
	}
	p, err := g.distribution(ctx, rt, acts, pos, temp)
	return nil, p, err
}

// distribution is Next's distribution from the forward that made acts.
func (g *GPT) distribution(ctx context.Context, rt linear.Runtime, acts *gptActs, pos int, temp float64) ([]float64, error) {
	c := g.Cfg
	var err error
	vl := acts.logits.Dim(1)
	row, err := g.act(rt, "next.row", 1, vl)
	if err != nil {
		return nil, err
	}
	// With ep or dp, the first sequence's row is ep (dp) rank 0's; with
	// cp, the cp rank's that holds position pos (at its index there): the
	// others add zeros.
	owner, at := c.cpOwner(pos)
	n := vl * acts.logits.DType().Size()
	if err := rt.Kernels.Copy2D(row, 0, n, acts.logits, at*n, n, n, 1); err != nil {
		return nil, err
	}
	if g.nextMove.Steps == nil {
		from := c.specOver([]int{1, c.Vocab}, placement.Partial{Op: placement.Sum}, placement.Shard{Dim: 1})
		to := c.spec([]int{1, c.Vocab}, placement.Replicate{})
		if g.nextMove, err = planMove(ctx, nil, "next", from, to); err != nil {
			return nil, err
		}
	}
	if c.split() > 1 && (g.batchRank() != 0 || g.cpRank() != owner) {
		if err := rt.Kernels.Zero(row, 0, row.Bytes()); err != nil {
			return nil, err
		}
	}
	all, err := linear.Execute(ctx, rt, "gpt", "next", g.nextMove, row, g.rank, g.bufs, "sample")
	if err != nil {
		return nil, err
	}
	host, err := tensor.Download(all)
	if err != nil {
		return nil, err
	}
	if host, err = tensor.Convert(host, tensor.Float32); err != nil {
		return nil, err
	}
	logits := host.Float32()
	top := math.Inf(-1)
	for _, l := range logits {
		top = max(top, float64(l))
	}
	p := make([]float64, len(logits))
	var z float64
	for i, l := range logits {
		p[i] = math.Exp((float64(l) - top) / temp)
		z += p[i]
	}
	for i := range p {
		p[i] /= z
	}
	return p, nil
}
