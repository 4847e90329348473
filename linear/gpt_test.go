package linear_test

import (
	"context"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/job"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

type gptRun struct {
	losses []float64
	comms  map[string]int // "kind tensor" -> count on rank 0, last step
}

// trainGPT trains a small GPT on tp ranks for steps steps on random tokens
// drawn alike on every rank.
func trainGPT(t *testing.T, tp, steps int, opt string) gptRun {
	m, err := placement.ParseMesh("tp=" + string(rune('0'+tp)))
	if err != nil {
		t.Fatal(err)
	}
	k, err := providers.New("cpu", nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := linear.GPTConfig{Mesh: m, Vocab: 13, Dim: 16, Heads: 4, Layers: 2, Context: 6, Batch: 3, Seed: 9,
		Optimizer: opt, LR: 3e-3, WeightDecay: 0.1}
	if opt == "sgd" {
		cfg.LR = 0.5
	}
	var mu sync.Mutex
	run := gptRun{comms: map[string]int{}}
	err = job.InProcess(context.Background(), m.Size(), func(ctx context.Context, w *collective.World) error {
		g, err := linear.NewGPT(cfg, w.Rank(), nil)
		if err != nil {
			return err
		}
		rt := linear.Runtime{World: w, Kernels: k}
		rng := rand.New(rand.NewPCG(1, 1))
		for s := 0; s < steps; s++ {
			ids, tg := tensor.New(tensor.Float32, cfg.Tokens()), tensor.New(tensor.Float32, cfg.Tokens())
			for i := range ids.Float32() {
				ids.Float32()[i] = float32(rng.IntN(cfg.Vocab))
				tg.Float32()[i] = float32((int(ids.Float32()[i]) + 1) % cfg.Vocab) // learnable: next id
			}
			if w.Rank() == 0 && s == steps-1 {
				rt.Record = func(name string, ex collective.Executed) {
					if len(ex.Group) > 1 && ex.Kind.Moves() {
						mu.Lock()
						run.comms[ex.Kind.String()+" "+name]++
						mu.Unlock()
					}
				}
			}
			loss, err := g.Step(ctx, rt, ids, tg)
			if err != nil {
				return err
			}
			if w.Rank() == 0 {
				mu.Lock()
				run.losses = append(run.losses, loss)
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

// TestGPTMatchesSingleRank: the same model trained at tp = 2 and 4 gives
// the single rank's losses, and a block costs Megatron's collectives.
func TestGPTMatchesSingleRank(t *testing.T) {
	for _, opt := range []string{"adamw", "sgd"} {
		ref := trainGPT(t, 1, 8, opt)
		if !(ref.losses[7] < ref.losses[0]-0.05) {
			t.Fatalf("%s: loss does not fall: %v", opt, ref.losses)
		}
		if math.Abs(ref.losses[0]-math.Log(13)) > 0.1 {
			t.Errorf("%s: first loss %.4f, want about ln 13 = %.4f", opt, ref.losses[0], math.Log(13))
		}
		for _, tp := range []int{2, 4} {
			got := trainGPT(t, tp, 8, opt)
			for i, l := range got.losses {
				if d := math.Abs(l-ref.losses[i]) / ref.losses[i]; d > 1e-5 {
					t.Fatalf("%s tp=%d step %d: loss %.7f, single rank %.7f", opt, tp, i, l, ref.losses[i])
				}
			}
			// Per block 2 all-reduces forward (attention and MLP outputs) and 2
			// backward (their inputs' gradients), as Megatron; the embedding's
			// one, the head's input gradient, and the loss's all-gather.
			want := map[string]int{"all_reduce y": 4 + 0, "all_reduce dx": 4 + 1, "all_reduce embedding": 1, "all_gather ce_stats": 1}
			for k, v := range want {
				if got.comms[k] != v {
					t.Errorf("%s tp=%d: %d %q per step, want %d (all: %v)", opt, tp, got.comms[k], k, v, got.comms)
				}
			}
			t.Logf("%s tp=%d: losses %.4f -> %.4f, collectives per step %v", opt, tp, got.losses[0], got.losses[7], got.comms)
		}
	}
}
