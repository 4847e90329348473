package models

import (
	"fmt"

	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// GPTConfig describes a GPT-2 style decoder trained with tensor parallelism
// on a 1-D mesh (tp), Megatron's layout:
//
//   - a vocabulary-parallel token embedding (rows split over tp, the lookup's
//     partial sums all-reduced) plus a learned position embedding;
//   - Layers pre-norm blocks: x += proj(attention(qkv(ln1(x)))), x +=
//     down(gelu(up(ln2(x)))), with qkv and up column-parallel (whole heads per
//     rank) and proj and down row-parallel (one all-reduce each forward, one
//     for qkv's and up's input gradients backward);
//   - a final layer norm and an untied head split by vocabulary, whose
//     cross-entropy combines each shard's max, sum of exponentials and target
//     logit (one all-gather of 3 numbers per token) and never gathers logits.
type GPTConfig struct {
	Mesh                                      placement.Mesh
	Vocab, Dim, Heads, Layers, Context, Batch int
	Seed                                      uint64
	// Optimizer is "adamw" (the default: β = 0.9, 0.95, eps 1e-8, weight
	// decay WeightDecay on the matrices) or "sgd".
	Optimizer       string
	LR, WeightDecay float64
	// Planner plans the model's layers and moves (see
	// linear.Config.Planner), each within a placement.DefaultBudget of its
	// own, sharing its cache: a layer repeated is planned once.
	Planner *placement.Planner
	// SequenceParallel splits the tokens over tp outside the linear layers
	// (Megatron's sequence parallelism): layer norms and residual adds run
	// on each rank's rows, the column-parallel layers all-gather their input
	// and the row-parallel ones reduce-scatter their output instead of one
	// all-reduce, the embedding's partial sums are reduce-scattered, and the
	// layer norms' parameter gradients (partial over the rows) all-reduced.
	SequenceParallel bool
	// DType is the compute dtype (0: float32). With bfloat16 the
	// activations, the linear layers' GEMMs and the collectives of
	// activations run in bfloat16; parameters, their gradients and AdamW's
	// moments stay float32 (bfloat16 copies of the parameters are refreshed
	// after each update), as mlp's mixed precision.
	DType tensor.DType
}

// Compute is the compute dtype (DType, float32 by default).
func (c GPTConfig) Compute() tensor.DType {
	if c.DType == 0 {
		return tensor.Float32
	}
	return c.DType
}

// Tokens is the tokens of one step, Batch × Context.
func (c GPTConfig) Tokens() int { return c.Batch * c.Context }

func (c GPTConfig) check() error {
	switch {
	case c.Mesh.NDim() != 1:
		return fmt.Errorf("%w: gpt: mesh %s: one dim (tensor parallel)", linear.ErrConfig, c.Mesh)
	case c.Vocab < 1 || c.Dim < 1 || c.Heads < 1 || c.Layers < 0 || c.Context < 1 || c.Batch < 1:
		return fmt.Errorf("%w: gpt: vocab %d, dim %d, heads %d, layers %d, context %d, batch %d: all at least 1 (layers 0)",
			linear.ErrConfig, c.Vocab, c.Dim, c.Heads, c.Layers, c.Context, c.Batch)
	case c.Dim%c.Heads != 0:
		return fmt.Errorf("%w: gpt: dim %d is not a multiple of heads %d", linear.ErrConfig, c.Dim, c.Heads)
	case c.Heads%c.Mesh.Size() != 0:
		return fmt.Errorf("%w: gpt: %d heads do not split over tp = %d (each rank holds whole heads)", linear.ErrConfig, c.Heads, c.Mesh.Size())
	case c.Vocab < c.Mesh.Size():
		return fmt.Errorf("%w: gpt: vocabulary %d smaller than tp = %d", linear.ErrConfig, c.Vocab, c.Mesh.Size())
	case c.Compute() != tensor.Float32 && c.Compute() != tensor.BFloat16:
		return fmt.Errorf("%w: gpt: dtype %v (float32 or bfloat16)", linear.ErrConfig, c.Compute())
	case c.Optimizer != "" && c.Optimizer != "adamw" && c.Optimizer != "sgd":
		return fmt.Errorf("%w: gpt: optimizer %q (adamw or sgd)", linear.ErrConfig, c.Optimizer)
	}
	return nil
}

// PlanGPT checks cfg as NewGPT does and lists what a checkpoint of the model
// holds (State's names and layouts; their tensors nil, nothing allocated);
// withState false lists the parameters only (Params).
func PlanGPT(cfg GPTConfig, withState bool) ([]linear.Param, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	mesh, t, d, v := cfg.Mesh, cfg.Tokens(), cfg.Dim, cfg.Vocab
	var out []linear.Param
	add := func(name string, s placement.Spec) {
		out = append(out, linear.Param{Name: name, Spec: s})
		if withState && cfg.Optimizer != "sgd" {
			out = append(out, linear.Param{Name: name + ".exp_avg", Spec: s}, linear.Param{Name: name + ".exp_avg_sq", Spec: s})
		}
	}
	rep := func(shape ...int) placement.Spec { return placement.MustSpec(shape, mesh, placement.Replicate{}) }
	layer := func(name, preset string, n, k int, bias bool) error {
		l, err := layout.Preset(preset, mesh, t, k, n, bias)
		if err != nil {
			return err
		}
		add(name+".weight", l.W)
		if bias {
			add(name+".bias", *l.B)
		}
		return nil
	}
	add("wte", placement.MustSpec([]int{v, d}, mesh, placement.Shard{Dim: 0}))
	add("wpe", rep(cfg.Context, d))
	norm := func(name string) {
		add(name+".weight", rep(d))
		add(name+".bias", rep(d))
	}
	for i := 0; i < cfg.Layers; i++ {
		p := fmt.Sprintf("h.%d.", i)
		norm(p + "ln_1")
		for _, l := range []struct {
			name, preset string
			n, k         int
		}{{"attn.c_attn", "column", 3 * d, d}, {"attn.c_proj", "row", d, d}} {
			if err := layer(p+l.name, l.preset, l.n, l.k, true); err != nil {
				return nil, err
			}
		}
		norm(p + "ln_2")
		for _, l := range []struct {
			name, preset string
			n, k         int
		}{{"mlp.c_fc", "column", 4 * d, d}, {"mlp.c_proj", "row", d, 4 * d}} {
			if err := layer(p+l.name, l.preset, l.n, l.k, true); err != nil {
				return nil, err
			}
		}
	}
	norm("ln_f")
	if err := layer("lm_head", "column", v, d, false); err != nil {
		return nil, err
	}
	return out, nil
}
