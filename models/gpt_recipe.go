package models

import (
	"context"
	"fmt"
	"math"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// checkRecipe checks the learning rate's schedule and the clipping.
func (c GPTConfig) checkRecipe() error {
	switch {
	case !(c.ClipGrad >= 0) || math.IsInf(c.ClipGrad, 0):
		return fmt.Errorf("%w: gpt: clip-grad %v (finite, at least 0; 0: off)", linear.ErrConfig, c.ClipGrad)
	case c.Warmup < 0:
		return fmt.Errorf("%w: gpt: warmup %d steps (at least 0)", linear.ErrConfig, c.Warmup)
	case c.Decay != "" && c.Decay != "constant" && c.Decay != "cosine":
		return fmt.Errorf("%w: gpt: lr-decay %q (constant or cosine)", linear.ErrConfig, c.Decay)
	case c.Decay == "cosine" && c.DecaySteps <= c.Warmup:
		return fmt.Errorf("%w: gpt: a cosine decay ending at step %d (the last) after a warmup of %d steps: the warmup must end first", linear.ErrConfig, c.DecaySteps, c.Warmup)
	case !(c.MinLR >= 0) || c.MinLR > c.LR:
		return fmt.Errorf("%w: gpt: min-lr %v (between 0 and the learning rate %v)", linear.ErrConfig, c.MinLR, c.LR)
	}
	return nil
}

// Scheduled reports whether the learning rate changes over the steps (a
// warmup or a cosine decay).
func (c GPTConfig) Scheduled() bool { return c.Warmup > 0 || c.Decay == "cosine" }

// LRAt is the learning rate of optimizer step n (the first is 1): LR·n/Warmup
// over the warmup, then LR, or under a cosine decay MinLR + (LR −
// MinLR)·(1 + cos(π·(n − Warmup)/(DecaySteps − Warmup)))/2 until
// DecaySteps, MinLR after: Megatron's warmup and cosine, counted from
// step 1 (the first step's rate is not 0; the last's, at DecaySteps, is
// MinLR).
func (c GPTConfig) LRAt(n int) float64 {
	if n <= c.Warmup {
		return c.LR * float64(n) / float64(c.Warmup)
	}
	if c.Decay != "cosine" {
		return c.LR
	}
	if n >= c.DecaySteps {
		return c.MinLR
	}
	f := float64(n-c.Warmup) / float64(c.DecaySteps-c.Warmup)
	return c.MinLR + (c.LR-c.MinLR)*(1+math.Cos(math.Pi*f))/2
}

// copies is how many ranks of the model's mesh hold the same values of a
// parameter's (reduced) gradient: the product of the mesh dims it is
// replicated over.
func copies(s placement.Spec) (int, error) {
	n := 1
	for i, pl := range s.Placements {
		switch pl.(type) {
		case placement.Replicate:
			n *= s.Mesh.Dim(i)
		case placement.Shard:
		default:
			return 0, fmt.Errorf("%w: gpt: a parameter's gradient laid out as %s", linear.ErrConfig, s)
		}
	}
	return n, nil
}

// GradSquares is this rank's share of the sum of the squares of the
// model's reduced gradients (Gradients): each parameter's local sum over
// the ranks that hold the same values, so that the sum over every rank of
// the model (and over the pipeline's stages) is the whole model's. One
// float32 comes back to the host. 0 without ClipGrad: nothing needs it.
func (g *GPT) GradSquares(rt linear.Runtime) (float64, error) {
	if g.Cfg.ClipGrad <= 0 {
		return 0, nil
	}
	sq, err := g.get(rt, "clip.squares", 1)
	if err != nil {
		return 0, err
	}
	if len(g.grads) != len(g.params) || len(g.params) == 0 {
		return 0, fmt.Errorf("%w: gpt: the gradients' norm before the gradients", linear.ErrConfig)
	}
	for i, p := range g.params {
		n, err := copies(p.spec)
		if err != nil {
			return 0, err
		}
		d := g.grads[i]
		if d.DType() != tensor.Float32 {
			return 0, fmt.Errorf("%w: gpt: %s's gradient is %v, want float32", linear.ErrConfig, p.name, d.DType())
		}
		// sq (+)= (1/n)·dᵀd: a gemv of the gradient as one row by itself.
		beta := 1.0
		if i == 0 {
			beta = 0
		}
		if err := rt.Kernels.Gemv(kernels.GemvParams{M: 1, N: d.Len(), Alpha: 1 / float64(n), Beta: beta, DType: tensor.Float32}, d, d, sq); err != nil {
			return 0, fmt.Errorf("gpt: the norm of %s's gradient: %w", p.name, err)
		}
	}
	h, err := tensor.Download(sq)
	if err != nil {
		return 0, err
	}
	return float64(h.Float32()[0]), nil
}

// clipScale is the factor the gradients are scaled by at the global sum
// of their squares sq (torch's clip_grad_norm_: max_norm / (norm + 1e-6),
// when under 1), with ClipGrad.
func (c GPTConfig) clipScale(sq float64) float64 {
	return min(1, c.ClipGrad/(math.Sqrt(sq)+1e-6))
}

// worldSquares sums this rank's GradSquares over the model's ranks (the
// whole world: a model without pipeline stages).
func (g *GPT) worldSquares(ctx context.Context, rt linear.Runtime, mine float64) (float64, error) {
	grp, err := rt.World.WorldGroup(ctx)
	if err != nil {
		return 0, err
	}
	v := []float64{mine}
	end := func() {}
	if rt.Trace != nil {
		end = rt.Trace("grad_norm", "collective")
	}
	defer end()
	if err := collective.AllReduce(ctx, grp, v, collective.Sum); err != nil {
		return 0, fmt.Errorf("gpt: the gradients' norm: %w", err)
	}
	return v[0], nil
}

// GradNorm is the last step's global gradient norm before clipping (with
// ClipGrad; 0 before the first step or without it).
func (g *GPT) GradNorm() float64 { return g.gradNorm }

// FlopsPerStep is the model's floating-point operations in one training
// step (forward and backward, no recomputation), Megatron's count
// (Narayanan et al., 2021): per token, 3× the forward's 2 per
// multiply-add: a block's projections 4·Dim² (q, k, v and the output), its
// MLP 8·Dim² (TopK experts' with experts), attention's scores and their
// weighted sum 2·Context·Dim, and the head's Vocab·Dim; for dense blocks
// 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)). Layer norms, the softmax and
// the elementwise ops are left out, as there.
func (c GPTConfig) FlopsPerStep() float64 {
	h, s, l, v := float64(c.Dim), float64(c.Context), float64(c.Layers), float64(c.Vocab)
	k := 1.0
	if c.Experts > 0 {
		k = float64(c.TopK)
	}
	perToken := l*(4*h*h+8*h*h*k+2*s*h) + v*h // multiply-adds of the forward
	return 3 * 2 * perToken * float64(c.Tokens())
}
