package models_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/job"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// moeGPT is the small GPT of the mixture-of-experts tests on mesh.
func moeGPT(t *testing.T, mesh string, experts, topK int) models.GPTConfig {
	m, err := placement.ParseMesh(mesh)
	if err != nil {
		t.Fatal(err)
	}
	return models.GPTConfig{Mesh: m, Vocab: 13, Dim: 16, Heads: 4, Layers: 2, Context: 6, Batch: 4, Seed: 9,
		Optimizer: "adamw", LR: 3e-3, WeightDecay: 0.1, Experts: experts, TopK: topK, AuxCoef: 0.01}
}

// moeRun is rank 0's losses and aux losses of a training run.
type moeRun struct{ losses, aux []float64 }

// trainMoE trains cfg for steps steps on its mesh's ranks, in process on the
// cpu, the model's memory the ranks' kernels, on random batches drawn alike
// on every rank.
func trainMoE(t *testing.T, cfg models.GPTConfig, steps int) moeRun {
	t.Helper()
	var mu sync.Mutex
	var run moeRun
	err := job.InProcess(context.Background(), cfg.Mesh.Size(), func(ctx context.Context, w *collective.World) error {
		k, err := providers.New("cpu", nil)
		if err != nil {
			return err
		}
		g, err := models.NewGPT(cfg, w.Rank(), k)
		if err != nil {
			return err
		}
		rt := linear.Runtime{World: w, Kernels: k}
		rng := rand.New(rand.NewPCG(1, 1))
		ids, tg := tensor.New(tensor.Float32, cfg.Tokens()), tensor.New(tensor.Float32, cfg.Tokens())
		for range steps {
			for i := range ids.Float32() {
				ids.Float32()[i] = float32(rng.IntN(cfg.Vocab))
				tg.Float32()[i] = float32((int(ids.Float32()[i]) + 1) % cfg.Vocab)
			}
			loss, err := g.Step(ctx, rt, ids, tg)
			if err != nil {
				return err
			}
			if w.Rank() == 0 {
				mu.Lock()
				run.losses = append(run.losses, loss)
				run.aux = append(run.aux, g.AuxLoss())
				mu.Unlock()
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// sameLosses fails unless every step's loss of got is within tol relative of
// want's.
func sameLosses(t *testing.T, what string, got, want []float64, tol float64) float64 {
	t.Helper()
	var worst float64
	for i := range want {
		d := math.Abs(got[i]-want[i]) / want[i]
		worst = max(worst, d)
		if d > tol {
			t.Errorf("%s: step %d loss %.7f, want %.7f (relative %.2g)", what, i+1, got[i], want[i], d)
		}
	}
	return worst
}

// TestGPTOneExpertIsDense: with one expert and top-1 the gate is 1 and the
// expert is drawn as the dense MLP: the losses are the dense GPT's on tp=2.
func TestGPTOneExpertIsDense(t *testing.T) {
	dense := trainMoE(t, moeGPT(t, "tp=2", 0, 0), 5)
	one := trainMoE(t, moeGPT(t, "tp=2", 1, 1), 5)
	worst := sameLosses(t, "one expert", one.losses, dense.losses, 1e-4)
	t.Logf("dense %v\none expert %v\nworst relative difference %.2g", dense.losses, one.losses, worst)
	for i, a := range one.aux {
		if math.Abs(a-0.01*2) > 1e-9 {
			t.Errorf("step %d: aux loss %v, want 0.01 × 2 layers × 1", i+1, a)
		}
	}
}

// TestGPTExpertsDataParallelOverEP: 4 experts, top-2, on ep=2,tp=2 (the
// batch split over ep, the experts over ep and their inner dim over tp)
// gives the single rank's losses and aux losses.
func TestGPTExpertsDataParallelOverEP(t *testing.T) {
	ref := trainMoE(t, moeGPT(t, "ep=1,tp=1", 4, 2), 5)
	got := trainMoE(t, moeGPT(t, "ep=2,tp=2", 4, 2), 5)
	worst := sameLosses(t, "ep=2,tp=2", got.losses, ref.losses, 1e-4)
	sameLosses(t, "ep=2,tp=2 aux", got.aux, ref.aux, 1e-4)
	t.Logf("ep=1,tp=1 %v\nep=2,tp=2 %v\nworst relative difference %.2g; aux %v", ref.losses, got.losses, worst, got.aux)
	if !(ref.losses[4] < ref.losses[0]) {
		t.Errorf("loss does not fall: %v", ref.losses)
	}
}

// TestGPTExpertsRefused: the settings a mixture-of-experts GPT refuses, each
// with one line naming what is wrong.
func TestGPTExpertsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*models.GPTConfig)
		want string
	}{
		{"top-k over experts", func(c *models.GPTConfig) { c.TopK = 5 }, "top-k 5 with 4 experts"},
		{"top-k 0", func(c *models.GPTConfig) { c.TopK = 0 }, "top-k 0 with 4 experts"},
		{"bfloat16", func(c *models.GPTConfig) { c.DType = tensor.BFloat16 }, "float32 only"},
		{"sequence parallel", func(c *models.GPTConfig) { c.SequenceParallel = true }, "sequence parallelism"},
		{"batch over ep", func(c *models.GPTConfig) { c.Batch = 3 }, "batch 3 is not a multiple of ep = 2"},
		{"mesh order", func(c *models.GPTConfig) { c.Mesh = placement.MustMesh([]int{2, 2}, []string{"tp", "ep"}) }, "ep=E,tp=N"},
		{"2-D dense", func(c *models.GPTConfig) { c.Experts = 0 }, "one dim"},
	} {
		cfg := moeGPT(t, "ep=2,tp=2", 4, 2)
		tc.edit(&cfg)
		_, err := models.PlanGPT(cfg, false)
		if err == nil || !errors.Is(err, linear.ErrConfig) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line naming %q", tc.name, err, tc.want)
		}
	}
}

// TestGPTExpertsPlan: a checkpoint of the model lists each block's layer's
// parameters as the layer lays them out.
func TestGPTExpertsPlan(t *testing.T) {
	ps, err := models.PlanGPT(moeGPT(t, "ep=2,tp=2", 4, 2), true)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, p := range ps {
		got[p.Name] = p.Spec.String()
	}
	for _, name := range []string{"h.1.moe.router.weight", "h.0.moe.w1", "h.0.moe.b1", "h.0.moe.w2", "h.0.moe.b2.exp_avg_sq", "h.1.attn.c_attn.weight", "wte"} {
		if _, ok := got[name]; !ok {
			t.Errorf("no %s in %v", name, got)
		}
	}
	if _, ok := got["h.0.mlp.c_fc.weight"]; ok {
		t.Errorf("the dense MLP's parameters are listed too")
	}
	t.Logf("w1 %s, wte %s", got["h.0.moe.w1"], got["wte"])
	// The model built lists the same parameters, in the same layouts.
	k, err := providers.New("cpu", nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := models.NewGPT(moeGPT(t, "ep=2,tp=2", 4, 2), 3, k)
	if err != nil {
		t.Fatal(err)
	}
	params := g.Params()
	for _, p := range params {
		if s, ok := got[p.Name]; !ok || s != p.Spec.String() {
			t.Errorf("the model holds %s %s; the plan lists %q", p.Name, p.Spec, s)
		}
	}
	if want, _ := models.PlanGPT(moeGPT(t, "ep=2,tp=2", 4, 2), false); len(params) != len(want) {
		t.Errorf("the model holds %d parameters, the plan lists %d", len(params), len(want))
	}
}
