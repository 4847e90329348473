package models

import (
	"fmt"
	"math"
	"strings"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
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
//
// On a mesh cp=C or cp=C,tp=N the model is context parallel as well: each
// sequence is split over cp in the zigzag layout, attention is ring
// attention over cp, everything else runs on the rank's tokens, and the
// parameters are replicated over cp (gpt_cp.go). The context must be a
// multiple of 2·cp; cp does not combine with experts or sequence
// parallelism.
//
// On a mesh dp=D, dp=D,tp=N, dp=D,cp=C or dp=D,cp=C,tp=N the model is data
// parallel as well: each dp rank takes Batch/dp whole sequences of every
// step's batch (under cp, split over cp as above), the parameters are
// replicated over dp and their gradients summed over dp (with cp, over dp
// and cp in one all-reduce), and the loss is the mean over the whole
// batch. Batch must be a multiple of dp; dp does not combine with experts
// (ep=E,tp=N splits the batch then) or sequence parallelism.
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
	// Experts > 0 replaces each block's MLP with a mixture-of-experts layer
	// (package moe, docs/moe.md) of Experts experts, each an MLP of inner
	// size 4·Dim, every token routed to TopK of them (1 ≤ TopK ≤ Experts),
	// Mixtral's layout. The mesh may then be tp=N or ep=E,tp=N: attention,
	// the embeddings, the norms and the head keep their tensor parallelism
	// over tp and are data parallel over ep (each ep rank holds Batch/ep
	// whole sequences; their gradients summed over ep); the experts are
	// split over ep and their inner dim over tp (spmd.PlanMoE). The layer
	// computes in float32 only and does not combine with sequence
	// parallelism.
	Experts, TopK int
	// AuxCoef weighs the layers' load-balancing losses added to the
	// objective (the layer computes their gradient); CapacityFactor is each
	// expert's capacity factor (0: dropless).
	AuxCoef, CapacityFactor float64
	// RingKernels run ring attention on host float32 tensors under context
	// parallelism (a mesh cp=C or cp=C,tp=N; see gpt_cp.go); nil: the
	// rank's own kernels, which must then work on the host.
	RingKernels kernels.Kernels
	// Part is a pipeline stage's share of the model (gpt_stage.go); nil:
	// all of it. Batch is then one micro-batch's sequences.
	Part *GPTPart
	// LossTokens is what the loss is the mean over (0: Tokens()): a
	// micro-batch's loss is its share of the step's mean, Batch × Context ×
	// the micro-batches.
	LossTokens int
	// ClipGrad > 0 scales each step's gradients so that their global L2
	// norm, over the whole model's parameters (every rank's shards and
	// pipeline stages, each copy counted once), is at most ClipGrad:
	// torch.nn.utils.clip_grad_norm_, Megatron's --clip-grad. 0: off.
	ClipGrad float64
	// The learning rate's schedule (LRAt): Warmup steps rising linearly to
	// LR, then Decay "cosine" down to MinLR at step DecaySteps along a half
	// cosine, MinLR after; "" or "constant": LR throughout.
	Warmup, DecaySteps int
	Decay              string
	MinLR              float64
}

// GPTPart is a pipeline stage's share of a GPT: blocks [Lo, Hi), the
// embeddings on the first stage, the final layer norm, the head and the loss
// on the last.
type GPTPart struct {
	Lo, Hi      int
	First, Last bool
}

// owns reports whether the part holds block i.
func (c GPTConfig) owns(i int) bool { return c.Part == nil || i >= c.Part.Lo && i < c.Part.Hi }

// first and last report whether the part holds the embeddings (the first
// stage's) and the head and loss (the last's).
func (c GPTConfig) first() bool { return c.Part == nil || c.Part.First }
func (c GPTConfig) last() bool  { return c.Part == nil || c.Part.Last }

// lossTokens is what the loss is the mean over.
func (c GPTConfig) lossTokens() int {
	if c.LossTokens > 0 {
		return c.LossTokens
	}
	return c.Tokens()
}

// checkPart checks a pipeline stage's share and what the stages do not
// combine with yet.
func (c GPTConfig) checkPart() error {
	p := c.Part
	switch {
	case p == nil:
		return nil
	case p.Lo < 0 || p.Hi < p.Lo || p.Hi > c.Layers:
		return fmt.Errorf("%w: gpt: pipeline stage of blocks [%d, %d) in a model of %d", linear.ErrConfig, p.Lo, p.Hi, c.Layers)
	}
	return nil
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

// EP is the ep dim's size: 1 without experts or on a 1-D mesh.
func (c GPTConfig) EP() int { return c.size("ep") }

// CP is the cp dim's size: 1 without context parallelism.
func (c GPTConfig) CP() int { return c.size("cp") }

// DP is the dp dim's size: 1 without data parallelism.
func (c GPTConfig) DP() int { return c.size("dp") }

// dimOf is the index of the mesh's dim named name, or −1.
func (c GPTConfig) dimOf(name string) int {
	for i, n := range c.Mesh.Names() {
		if n == name {
			return i
		}
	}
	return -1
}

// size is the size of the mesh's dim named name, 1 without it.
func (c GPTConfig) size(name string) int {
	if i := c.dimOf(name); i >= 0 {
		return c.Mesh.Dim(i)
	}
	return 1
}

// splitDims are the dims the tokens are split over outside tp (ep, or dp
// and cp): every dim but the last. The ranks along them sum the gradients
// of the replicated parameters.
func (c GPTConfig) splitDims() []int {
	var dims []int
	for i := 0; i < c.Mesh.NDim()-1; i++ {
		dims = append(dims, i)
	}
	return dims
}

// split is the number of ranks the tokens are split over outside tp.
func (c GPTConfig) split() int { return c.Mesh.Size() / c.TP() }

// normalized is c with a mesh of dp and cp only (dp=D, cp=C, dp=D,cp=C)
// given a last dim tp=1: tp last, as every mesh of the model.
func (c GPTConfig) normalized() GPTConfig {
	names := c.Mesh.Names()
	if len(names) == 0 || names[len(names)-1] == "tp" {
		return c
	}
	for _, n := range names {
		if n != "dp" && n != "cp" {
			return c
		}
	}
	shape := append(c.Mesh.Shape(), 1)
	c.Mesh = placement.MustMesh(shape, append(names, "tp"))
	return c
}

// TP is the tp dim's size (the mesh's last dim).
func (c GPTConfig) TP() int { return c.Mesh.Dim(c.Mesh.NDim() - 1) }

// localBatch is the sequences each ep (dp) rank holds, localContext the
// positions of each that a cp rank holds; localTokens their tokens.
func (c GPTConfig) localBatch() int   { return c.Batch / (c.EP() * c.DP()) }
func (c GPTConfig) localContext() int { return c.Context / c.CP() }
func (c GPTConfig) localTokens() int  { return c.localBatch() * c.localContext() }

func (c GPTConfig) check() error {
	if n := c.Mesh.Names(); len(n) > 0 && (n[0] == "cp" || n[0] == "dp") {
		if err := c.checkCP(); err != nil {
			return err
		}
	} else if c.Experts != 0 || c.Mesh.NDim() != 1 {
		if err := c.checkExperts(); err != nil {
			return err
		}
	}
	switch {
	case c.Vocab < 1 || c.Dim < 1 || c.Heads < 1 || c.Layers < 0 || c.Context < 1 || c.Batch < 1:
		return fmt.Errorf("%w: gpt: vocab %d, dim %d, heads %d, layers %d, context %d, batch %d: all at least 1 (layers 0)",
			linear.ErrConfig, c.Vocab, c.Dim, c.Heads, c.Layers, c.Context, c.Batch)
	case c.Dim%c.Heads != 0:
		return fmt.Errorf("%w: gpt: dim %d is not a multiple of heads %d", linear.ErrConfig, c.Dim, c.Heads)
	case c.Heads%c.TP() != 0:
		return fmt.Errorf("%w: gpt: %d heads do not split over tp = %d (each rank holds whole heads)", linear.ErrConfig, c.Heads, c.TP())
	case c.Vocab < c.TP():
		return fmt.Errorf("%w: gpt: vocabulary %d smaller than tp = %d", linear.ErrConfig, c.Vocab, c.TP())
	case c.Compute() != tensor.Float32 && c.Compute() != tensor.BFloat16:
		return fmt.Errorf("%w: gpt: dtype %v (float32 or bfloat16)", linear.ErrConfig, c.Compute())
	case c.Optimizer != "" && c.Optimizer != "adamw" && c.Optimizer != "sgd":
		return fmt.Errorf("%w: gpt: optimizer %q (adamw or sgd)", linear.ErrConfig, c.Optimizer)
	}
	if err := c.checkRecipe(); err != nil {
		return err
	}
	return c.checkPart()
}

// checkExperts checks the mesh and the mixture-of-experts settings of a
// model with experts (or a mesh that is not 1-D).
func (c GPTConfig) checkExperts() error {
	names := c.Mesh.Names()
	switch {
	case c.Experts < 0:
		return fmt.Errorf("%w: gpt: experts %d (0: no mixture of experts)", linear.ErrConfig, c.Experts)
	case c.Experts == 0:
		return fmt.Errorf("%w: gpt: mesh %s: one dim (tensor parallel), dp=D,tp=N (data parallel) or cp=C,tp=N (context parallel); a 2-D mesh ep=E,tp=N needs --experts", linear.ErrConfig, c.Mesh)
	case !(len(names) == 1 && names[0] == "tp") && !(len(names) == 2 && names[0] == "ep" && names[1] == "tp"):
		return fmt.Errorf("%w: gpt: mesh %s: with experts, tp=N or ep=E,tp=N (in that order)", linear.ErrConfig, c.Mesh)
	case c.TopK < 1 || c.TopK > c.Experts:
		return fmt.Errorf("%w: gpt: top-k %d with %d experts: each token goes to between 1 and --experts experts", linear.ErrConfig, c.TopK, c.Experts)
	case c.Compute() != tensor.Float32:
		return fmt.Errorf("%w: gpt: dtype %v with experts: the mixture-of-experts layer computes in float32 only", linear.ErrConfig, c.Compute())
	case c.SequenceParallel:
		return fmt.Errorf("%w: gpt: sequence parallelism does not combine with experts", linear.ErrConfig)
	case c.Batch%c.EP() != 0:
		return fmt.Errorf("%w: gpt: batch %d is not a multiple of ep = %d (each ep rank holds whole sequences)", linear.ErrConfig, c.Batch, c.EP())
	case !(c.AuxCoef >= 0) || math.IsInf(c.AuxCoef, 0):
		return fmt.Errorf("%w: gpt: aux-coef %v (finite, at least 0)", linear.ErrConfig, c.AuxCoef)
	case !(c.CapacityFactor >= 0) || math.IsInf(c.CapacityFactor, 0):
		return fmt.Errorf("%w: gpt: capacity factor %v (0: dropless, else positive)", linear.ErrConfig, c.CapacityFactor)
	}
	return nil
}

// checkCP checks a data- or context-parallel model's mesh (dp=D,tp=N,
// cp=C,tp=N or dp=D,cp=C,tp=N, normalized) and settings: each dp rank
// holds whole sequences, and the zigzag layout splits each sequence into
// 2·cp chunks.
func (c GPTConfig) checkCP() error {
	names := strings.Join(c.Mesh.Names(), ",")
	what := "context parallelism (cp)"
	if c.dimOf("dp") >= 0 {
		what = "data parallelism (dp)"
	}
	switch {
	case names != "cp,tp" && names != "dp,tp" && names != "dp,cp,tp":
		return fmt.Errorf("%w: gpt: mesh %s: with data or context parallelism, dp=D, cp=C or dp=D,cp=C, each optionally followed by tp=N (in that order)", linear.ErrConfig, c.Mesh)
	case c.Experts != 0:
		return fmt.Errorf("%w: gpt: %s does not combine with experts", linear.ErrConfig, what)
	case c.SequenceParallel:
		return fmt.Errorf("%w: gpt: %s does not combine with sequence parallelism", linear.ErrConfig, what)
	case c.Batch%c.DP() != 0:
		return fmt.Errorf("%w: gpt: batch %d is not a multiple of dp = %d (each dp rank holds whole sequences)", linear.ErrConfig, c.Batch, c.DP())
	case c.dimOf("cp") >= 0 && c.Context%(2*c.CP()) != 0:
		return fmt.Errorf("%w: gpt: context %d is not a multiple of 2·cp = %d (the zigzag layout splits each sequence into 2·cp equal chunks)",
			linear.ErrConfig, c.Context, 2*c.CP())
	}
	return nil
}

// moePlan plans the mixture-of-experts layer on the model's mesh: the
// tokens of a step, split over ep as the batch.
func (c GPTConfig) moePlan() (*spmd.MoEPlan, error) {
	p, err := spmd.PlanMoE(c.Mesh, spmd.MoEShape{T: c.Tokens(), H: c.Dim, F: 4 * c.Dim, E: c.Experts, K: c.TopK, Capacity: c.CapacityFactor}, 4)
	if err != nil {
		return nil, fmt.Errorf("%w: gpt: %w", linear.ErrConfig, err)
	}
	return p, nil
}

// spec lays out a tensor of the dense model: replicated over the dims
// before tp (ep, dp, cp), as tpp says over tp.
func (c GPTConfig) spec(shape []int, tpp placement.Placement) placement.Spec {
	return c.specOver(shape, placement.Replicate{}, tpp)
}

// specOver lays out a tensor as epp says over each dim before tp (ep, or
// dp and cp) and tpp over tp.
func (c GPTConfig) specOver(shape []int, epp, tpp placement.Placement) placement.Spec {
	ps := make([]placement.Placement, c.Mesh.NDim())
	for i := range ps {
		ps[i] = epp
	}
	ps[len(ps)-1] = tpp
	return placement.MustSpec(shape, c.Mesh, ps...)
}

// PlanGPT checks cfg as NewGPT does and lists what a checkpoint of the model
// holds (State's names and layouts; their tensors nil, nothing allocated);
// withState false lists the parameters only (Params).
func PlanGPT(cfg GPTConfig, withState bool) ([]linear.Param, error) {
	cfg = cfg.normalized()
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
	rep := func(shape ...int) placement.Spec { return cfg.spec(shape, placement.Replicate{}) }
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
	add("wte", cfg.spec([]int{v, d}, placement.Shard{Dim: 0}))
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
		if cfg.Experts > 0 {
			pl, err := cfg.moePlan()
			if err != nil {
				return nil, err
			}
			for _, m := range moeParams(pl) {
				add(p+m.name, m.spec)
			}
			continue
		}
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
