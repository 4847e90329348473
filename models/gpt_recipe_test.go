package models_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/placement"
)

// TestLRAt: the warmup rises linearly to LR, the cosine falls from LR to
// MinLR at DecaySteps (LR − MinLR)/2 above MinLR half-way, and stays there;
// without a decay LR holds after the warmup.
func TestLRAt(t *testing.T) {
	c := models.GPTConfig{LR: 1e-3, Warmup: 4, Decay: "cosine", DecaySteps: 24, MinLR: 1e-4}
	for _, tc := range []struct {
		n    int
		want float64
	}{{1, 2.5e-4}, {2, 5e-4}, {4, 1e-3}, {14, 5.5e-4}, {24, 1e-4}, {30, 1e-4}} {
		if got := c.LRAt(tc.n); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("cosine: step %d: lr %g, want %g", tc.n, got, tc.want)
		}
	}
	if got := c.LRAt(9); !(got < 1e-3 && got > 5.5e-4) {
		t.Errorf("cosine: step 9: lr %g, want between 5.5e-4 and 1e-3", got)
	}
	c.Decay = "constant"
	for n, want := range map[int]float64{1: 2.5e-4, 4: 1e-3, 5: 1e-3, 100: 1e-3} {
		if got := c.LRAt(n); math.Abs(got-want) > 1e-12 {
			t.Errorf("constant: step %d: lr %g, want %g", n, got, want)
		}
	}
	c.Warmup = 0
	if got := c.LRAt(1); got != 1e-3 {
		t.Errorf("no warmup: step 1: lr %g", got)
	}
}

// TestGPTRecipeRefused: a clipping norm or a schedule that cannot be is
// refused when the model is built, naming the setting.
func TestGPTRecipeRefused(t *testing.T) {
	m, _ := placement.ParseMesh("tp=1")
	base := models.GPTConfig{Mesh: m, Vocab: 11, Dim: 8, Heads: 2, Layers: 1, Context: 4, Batch: 2, Seed: 1, LR: 1e-3}
	for _, tc := range []struct {
		edit func(*models.GPTConfig)
		want string
	}{
		{func(c *models.GPTConfig) { c.ClipGrad = -1 }, "clip-grad -1"},
		{func(c *models.GPTConfig) { c.ClipGrad = math.NaN() }, "clip-grad NaN"},
		{func(c *models.GPTConfig) { c.Warmup = -2 }, "warmup -2"},
		{func(c *models.GPTConfig) { c.Decay = "linear" }, `lr-decay "linear"`},
		{func(c *models.GPTConfig) { c.Decay, c.Warmup, c.DecaySteps = "cosine", 10, 10 }, "the warmup must end first"},
		{func(c *models.GPTConfig) { c.MinLR = 1 }, "min-lr 1"},
	} {
		c := base
		tc.edit(&c)
		_, err := models.NewGPT(c, 0, nil)
		if !errors.Is(err, linear.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", c, err, tc.want)
		}
	}
}

// TestGPTRecipeMatchesPyTorch: with the gradients clipped to a global norm
// of 0.5 (PyTorch's clip_grad_norm_; the norm is above it at most steps,
// so the clipping acts) and the learning rate warmed up over 4 steps then
// decayed along a cosine to a tenth at step 20, meshrun at tp = 1, 2 and 4,
// and 2 and 4 sequence parallel, follows PyTorch's losses within
// gptTorchTol and its norms within recipeNormTol, relative, for 20 steps.
func TestGPTRecipeMatchesPyTorch(t *testing.T) {
	const steps = 20
	cfg := models.GPTConfig{Vocab: 29, Dim: 32, Heads: 4, Layers: 2, Context: 16, Batch: 4, Seed: 3, Optimizer: "adamw", LR: 3e-3, WeightDecay: 0.1,
		ClipGrad: 0.5, Warmup: 4, Decay: "cosine", DecaySteps: steps, MinLR: 3e-4}
	runs, want, norms := torchGPT(t, cfg, steps, map[string]any{"clip_grad": cfg.ClipGrad, "warmup": cfg.Warmup, "decay_steps": cfg.DecaySteps, "min_lr": cfg.MinLR})
	clipped := 0
	for _, n := range norms {
		if n > cfg.ClipGrad {
			clipped++
		}
	}
	if clipped < steps/2 {
		t.Fatalf("PyTorch's norms %v: over %v at %d steps of %d, want most (the clipping acting)", norms, cfg.ClipGrad, clipped, steps)
	}
	worstLoss, worstNorm := 0.0, 0.0
	for name, run := range runs {
		for s := range steps {
			dl := math.Abs(run.losses[s]-want[s]) / want[s]
			dn := math.Abs(run.norms[s]-norms[s]) / norms[s]
			worstLoss, worstNorm = max(worstLoss, dl), max(worstNorm, dn)
			if dl > gptTorchTol || dn > recipeNormTol {
				t.Errorf("%s step %d: loss %.7f, norm %.7f; PyTorch %.7f, %.7f", name, s+1, run.losses[s], run.norms[s], want[s], norms[s])
			}
		}
	}
	t.Logf("PyTorch: %.5f -> %.5f, norms %.4f -> %.4f (clipped at %d steps); meshrun within %.2g (losses), %.2g (norms) relative",
		want[0], want[steps-1], norms[0], norms[steps-1], clipped, worstLoss, worstNorm)
}

// recipeNormTol bounds the relative difference of a step's gradient norm
// from PyTorch's: 1.6e-7 is measured (float32 sums in another order).
const recipeNormTol = 1e-6

// TestFlopsPerStep: dense, Megatron's 72·B·s·l·h²·(1 + s/(6h) + V/(12lh));
// with top-2 experts the MLP's 48·B·s·l·h² (3 × 2 × 8h² a token) twice.
func TestFlopsPerStep(t *testing.T) {
	c := models.GPTConfig{Vocab: 50257, Dim: 768, Heads: 12, Layers: 12, Context: 1024, Batch: 8}
	B, s, l, h, v := 8.0, 1024.0, 12.0, 768.0, 50257.0
	want := 72 * B * s * l * h * h * (1 + s/(6*h) + v/(12*l*h))
	if got := c.FlopsPerStep(); math.Abs(got-want) > 1e-9*want {
		t.Errorf("dense: %g FLOPs, Megatron's count %g", got, want)
	}
	c.Experts, c.TopK = 8, 2
	if got := c.FlopsPerStep(); math.Abs(got-(want+48*B*s*l*h*h)) > 1e-9*want {
		t.Errorf("top-2 experts: %g FLOPs, want %g", got, want+48*B*s*l*h*h)
	}
}
