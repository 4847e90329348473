package models

import (
	"context"
	"fmt"
	"math"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// Params lists the model's parameters for checkpoints (--init), as this
// rank holds them.
func (g *GPT) Params() []linear.Param {
	var out []linear.Param
	for _, p := range g.params {
		out = append(out, linear.HeldParam(p.name, p.spec, p.w))
	}
	return out
}

// State lists the parameters and the optimizer's state, what a resumed run
// needs to go on as if never stopped: AdamW's moments under PyTorch's names
// (NAME.exp_avg, NAME.exp_avg_sq); the step count is the checkpoint's step
// (SetStep).
func (g *GPT) State() []linear.Param {
	var out []linear.Param
	for _, p := range g.params {
		out = append(out, linear.HeldParam(p.name, p.spec, p.w))
		if p.m != nil {
			out = append(out, linear.HeldParam(p.name+".exp_avg", p.spec, p.m), linear.HeldParam(p.name+".exp_avg_sq", p.spec, p.v))
		}
	}
	return out
}

// SetStep sets the number of optimizer steps taken (a resumed run's).
func (g *GPT) SetStep(n int) { g.step = n }

// GPTParam is one of the model's parameters as this rank holds it.
type GPTParam struct {
	Name  string // GPT-2's: wte, h.0.attn.c_attn.weight, ...
	Spec  placement.Spec
	W     *tensor.Tensor
	Decay bool // AdamW's weight decay applies
}

// Parameters lists the model's parameters in a fixed order.
func (g *GPT) Parameters() []GPTParam {
	var out []GPTParam
	for _, p := range g.params {
		out = append(out, GPTParam{p.name, p.spec, p.w, p.decay})
	}
	return out
}

// caster casts between dtypes on the rank's device.
type caster interface {
	Cast(dst, src *tensor.Tensor) error
}

// cpuCaster casts host tensors (NewGPT's parameters, before any runtime).
type cpuCaster struct{}

func (cpuCaster) Cast(dst, src *tensor.Tensor) error {
	h, err := tensor.Download(src)
	if err != nil {
		return err
	}
	c, err := tensor.Convert(h, dst.DType())
	if err != nil {
		return err
	}
	return tensor.MemoryOf(dst).Write(dst, 0, tensor.HostBytes(c), tensor.Transfer)
}

// refresh copies the held parameters into their compute-dtype copies.
func (g *GPT) refresh(k caster) error {
	for _, p := range g.params {
		if p.cw != nil {
			if err := k.Cast(p.cw, p.w); err != nil {
				return err
			}
		}
	}
	return nil
}

// norms are the layer norms' parameters (partial gradients under sequence
// parallelism).
func (g *GPT) norms() []*param {
	var out []*param
	for _, p := range g.params {
		if p.layer == nil && !p.expert && p != g.wte && p != g.wpe {
			out = append(out, p)
		}
	}
	return out
}

// reduceNorms all-reduces every layer norm's parameter gradient, partial
// over the rows under sequence parallelism, in one collective: packed into
// one buffer and back.
func (g *GPT) reduceNorms(ctx context.Context, rt linear.Runtime) error {
	ps := g.norms()
	if len(ps) == 0 { // a pipeline stage of embeddings alone
		return nil
	}
	d := g.Cfg.Dim
	buf, err := g.get(rt, "ln.grads", len(ps)*d)
	if err != nil {
		return err
	}
	n := 4 * d
	for i, p := range ps {
		if err := rt.Kernels.Copy2D(buf, i*n, n, p.g, 0, n, n, 1); err != nil {
			return err
		}
	}
	all, err := linear.Execute(ctx, rt, "gpt", "ln_grads", g.lnMove, buf, g.rank, g.bufs, "reduce")
	if err != nil {
		return err
	}
	for i, p := range ps {
		if err := rt.Kernels.Copy2D(p.g, 0, n, all, i*n, n, n, 1); err != nil {
			return err
		}
	}
	return nil
}

// update applies the optimizer to every parameter: the gradients reduced,
// clipped to the global norm (ClipGrad, the model's ranks being the whole
// world: a pipeline's stages sum their squares first, GPTStage), stepped.
func (g *GPT) update(ctx context.Context, rt linear.Runtime) error {
	if err := g.Gradients(ctx, rt); err != nil {
		return err
	}
	sq := 0.0
	if g.Cfg.ClipGrad > 0 {
		mine, err := g.GradSquares(rt)
		if err != nil {
			return err
		}
		if sq, err = g.worldSquares(ctx, rt, mine); err != nil {
			return err
		}
	}
	return g.Apply(ctx, rt, sq)
}

// Gradients reduces every parameter's gradient (the step's collectives),
// for GradSquares and Apply.
func (g *GPT) Gradients(ctx context.Context, rt linear.Runtime) error {
	c := g.Cfg
	for _, p := range g.norms() {
		if p.cg != nil {
			if err := rt.Kernels.Cast(p.g, p.cg); err != nil {
				return err
			}
		}
	}
	if c.SequenceParallel {
		if err := g.reduceNorms(ctx, rt); err != nil {
			return err
		}
	}
	if c.split() > 1 {
		if err := g.reduceOverSplit(ctx, rt); err != nil {
			return err
		}
	}
	g.grads = g.grads[:0]
	reduced := map[*linear.Layer][2]*tensor.Tensor{}
	for _, p := range g.params {
		grad := p.g
		if p.layer != nil {
			r, ok := reduced[p.layer]
			if !ok {
				dw, db, err := p.layer.Reduce(ctx, rt)
				if err != nil {
					return err
				}
				r = [2]*tensor.Tensor{dw, db}
				reduced[p.layer] = r
			}
			grad = r[0]
			if p.bias {
				grad = r[1]
			}
		}
		if grad == nil {
			return fmt.Errorf("%w: gpt: %s has no gradient", linear.ErrConfig, p.name)
		}
		g.grads = append(g.grads, grad)
	}
	return nil
}

// Apply steps the optimizer on the reduced gradients (Gradients), scaled
// to a global norm of at most ClipGrad at the sum of their squares over the
// whole model, sq (with ClipGrad), at the schedule's learning rate (LRAt).
func (g *GPT) Apply(ctx context.Context, rt linear.Runtime, sq float64) error {
	c := g.Cfg
	if len(g.grads) != len(g.params) {
		return fmt.Errorf("%w: gpt: the optimizer before the gradients", linear.ErrConfig)
	}
	g.step++
	lr := c.LRAt(g.step)
	scale := 1.0
	if c.ClipGrad > 0 {
		g.gradNorm, scale = math.Sqrt(sq), c.clipScale(sq)
	}
	for i, p := range g.params {
		grad := g.grads[i]
		if scale != 1 { // in place: the gradient is the step's own
			if err := rt.Kernels.Axpy(scale-1, grad, grad); err != nil {
				return fmt.Errorf("gpt: clipping %s's gradient: %w", p.name, err)
			}
		}
		var err error
		if c.Optimizer == "sgd" {
			err = rt.Kernels.Axpy(-lr, grad, p.w)
		} else {
			wd := 0.0
			if p.decay {
				wd = c.WeightDecay
			}
			err = rt.Op("adamw", func() error {
				return rt.Kernels.AdamW(kernels.AdamWParams{LR: lr, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: wd, Step: g.step}, p.w, grad, p.m, p.v)
			})
		}
		if err != nil {
			return fmt.Errorf("gpt: updating %s: %w", p.name, err)
		}
	}
	g.grads = g.grads[:0]
	return g.refresh(rt.Kernels)
}
