package models_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/job"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/pipeline"
	"github.com/meshrun/meshrun/pipeline/stage"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// stageGPT is the toy model of the pipeline tests: 4 blocks, a batch of 8,
// AdamW, or SGD (which, unlike AdamW, scales its update with the gradient:
// a micro-batch's gradient lost or counted twice shows).
func stageGPT(tp int, opt string) models.GPTConfig {
	c := models.GPTConfig{Mesh: placement.MustMesh([]int{tp}, []string{"tp"}), Vocab: 13, Dim: 16, Heads: 4, Layers: 4, Context: 6, Batch: 8,
		Seed: 9, Optimizer: opt, LR: 3e-3, WeightDecay: 0.1}
	if opt == "sgd" {
		c.LR = 0.5
	}
	return c
}

// batches draws steps batches of cfg's model alike on every rank: ids and
// their targets (the next id: learnable).
func batches(cfg models.GPTConfig, steps int) (ids, tgs [][]float32) {
	rng := rand.New(rand.NewPCG(1, 1))
	for range steps {
		id, tg := make([]float32, cfg.Tokens()), make([]float32, cfg.Tokens())
		for i := range id {
			id[i] = float32(rng.IntN(cfg.Vocab))
			tg[i] = float32((int(id[i]) + 1) % cfg.Vocab)
		}
		ids, tgs = append(ids, id), append(tgs, tg)
	}
	return ids, tgs
}

// pipelineRun is what trainPipeline measured: the losses of rank 0 and
// each stage's peak of micro-batches held and the bytes of their scratches.
type pipelineRun struct {
	losses []float64
	held   []int
	bytes  []int64 // the micro-batches' scratches (ScratchBytes)
	work   []int64 // the workspace they share (WorkBytes)
}

// trainPipeline trains cfg's model split into len(layers) stages (stage s
// holding layers[s] blocks) of tp ranks each, m micro-batches a step, on
// the schedule kind, in one process; every rank's loss must agree.
func trainPipeline(t *testing.T, cfg models.GPTConfig, layers []int, tp, m, steps int, kind pipeline.Kind) pipelineRun {
	t.Helper()
	p := len(layers)
	k, err := providers.New("cpu", nil)
	if err != nil {
		t.Fatal(err)
	}
	sched, err := pipeline.Schedule(kind, p, m)
	if err != nil {
		t.Fatal(err)
	}
	ids, tgs := batches(cfg, steps)
	run := pipelineRun{held: make([]int, p), bytes: make([]int64, p), work: make([]int64, p)}
	var mu sync.Mutex
	err = job.InProcess(context.Background(), p*tp, func(ctx context.Context, w *collective.World) error {
		s, local := w.Rank()/tp, w.Rank()%tp
		var mine, pp []int
		for r := range tp {
			mine = append(mine, s*tp+r)
		}
		for q := range p {
			pp = append(pp, q*tp+local)
		}
		view, err := w.View(mine)
		if err != nil {
			return err
		}
		lo := 0
		for q := range s {
			lo += layers[q]
		}
		c := cfg
		c.Batch, c.LossTokens = cfg.Batch/m, cfg.Tokens()
		c.Part = &models.GPTPart{Lo: lo, Hi: lo + layers[s], First: s == 0, Last: s == p-1}
		g, err := models.NewGPT(c, local, nil)
		if err != nil {
			return err
		}
		rt := linear.Runtime{World: view, Kernels: k}
		st := g.Stage(&rt)
		st.SetSplit(!kind.Fused())
		group, err := w.Group(ctx, pp)
		if err != nil {
			return err
		}
		all, err := w.WorldGroup(ctx)
		if err != nil {
			return err
		}
		n := c.Tokens()
		for step := range steps {
			var mbIDs, mbTgs []*tensor.Tensor
			for mb := range m {
				id, _ := tensor.FromFloat32(ids[step][mb*n:(mb+1)*n], n)
				tg, _ := tensor.FromFloat32(tgs[step][mb*n:(mb+1)*n], n)
				mbIDs, mbTgs = append(mbIDs, id), append(mbTgs, tg)
			}
			if err := st.Begin(mbIDs, mbTgs); err != nil {
				return err
			}
			if _, err := stage.Run(ctx, group, kind, sched, st, func(int) []int { return []int{n, c.Dim} }); err != nil {
				return err
			}
			loss := []float64{0}
			if s == p-1 && local == 0 {
				loss[0] = st.Loss()
			}
			if err := collective.AllReduce(ctx, all, loss, collective.Sum); err != nil {
				return err
			}
			if _, err := st.Reduce(ctx); err != nil {
				return err
			}
			if err := st.Finish(ctx, 0); err != nil {
				return err
			}
			if w.Rank() == 0 {
				mu.Lock()
				run.losses = append(run.losses, loss[0])
				mu.Unlock()
			}
		}
		if local == 0 {
			mu.Lock()
			run.held[s], run.bytes[s], run.work[s] = st.Held(), st.ScratchBytes(), st.WorkBytes()
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// wholeGPT trains cfg's model unsplit (one step a batch) on tp ranks.
func wholeGPT(t *testing.T, cfg models.GPTConfig, steps int) []float64 {
	ids, tgs := batches(cfg, steps)
	return trainSteps(t, cfg.Mesh, steps, func(rank int) (stepper, error) {
		g, err := models.NewGPT(cfg, rank, nil)
		if err != nil {
			return nil, err
		}
		step := 0
		return func(ctx context.Context, rt linear.Runtime) (float64, error) {
			id, _ := tensor.FromFloat32(ids[step], cfg.Tokens())
			tg, _ := tensor.FromFloat32(tgs[step], cfg.Tokens())
			step++
			return g.Step(ctx, rt, id, tg)
		}, nil
	}).losses
}

// TestGPTPipelineMatchesWhole: the model split into 2 and 4 stages (even,
// uneven, one empty), and 2 stages of tp = 2, trained with AdamW and with
// SGD on 4 and 8 micro-batches under GPipe, 1F1B and ZB-H1, follows the
// unsplit model's losses within 1e-5 relative at every step; GPipe's stages
// hold all m micro-batches at once, 1F1B's stage s at most p − s, and the
// bytes of their scratches are that many micro-batches' (GPipe's bytes over
// m; ZB-H2's against ZB-H1's, whose split backward keeps more), beside a
// workspace whatever the micro-batches held: a whole backward's gradients
// are in it, not in each micro-batch's scratch.
func TestGPTPipelineMatchesWhole(t *testing.T) {
	const steps = 6
	for _, opt := range []string{"adamw", "sgd"} {
		ref := wholeGPT(t, stageGPT(1, opt), steps)
		if !(ref[steps-1] < ref[0]-0.05) {
			t.Fatalf("%s: the unsplit model's loss does not fall: %v", opt, ref)
		}
		for _, tc := range []struct {
			layers []int
			tp     int
		}{{[]int{2, 2}, 1}, {[]int{1, 1, 1, 1}, 1}, {[]int{3, 1}, 1}, {[]int{0, 1, 2, 1}, 1}, {[]int{2, 2}, 2}} {
			for _, m := range []int{4, 8} {
				var slot, work map[int]int64 // one micro-batch's scratch bytes per stage and the workspace's: GPipe's for 1F1B, ZB-H1's for ZB-H2
				for _, kind := range []pipeline.Kind{pipeline.GPipe, pipeline.OneF1B, pipeline.ZBH1, pipeline.ZBH2} {
					name := fmt.Sprintf("%s layers %v tp=%d m=%d %v", opt, tc.layers, tc.tp, m, kind)
					got := trainPipeline(t, stageGPT(tc.tp, opt), tc.layers, tc.tp, m, steps, kind)
					for i, l := range got.losses {
						if d := math.Abs(l-ref[i]) / ref[i]; !(d <= 1e-5) {
							t.Fatalf("%s: step %d: loss %.7f, unsplit %.7f", name, i, l, ref[i])
						}
					}
					p := len(tc.layers)
					if kind == pipeline.GPipe || kind == pipeline.ZBH1 {
						fused := slot
						slot, work = map[int]int64{}, map[int]int64{}
						for s, b := range got.bytes {
							slot[s], work[s] = b/int64(got.held[s]), got.work[s]
							if kind == pipeline.ZBH1 && !(fused[s] < slot[s]) {
								t.Errorf("%s: stage %d: a micro-batch's scratch of %d bytes, GPipe's %d: the whole backward's gradients are not in the workspace", name, s, slot[s], fused[s])
							}
						}
					}
					for s, w := range got.work {
						if w <= 0 || w != work[s] {
							t.Errorf("%s: stage %d: a workspace of %d bytes, want %d whatever the micro-batches held", name, s, w, work[s])
						}
					}
					for s, b := range got.bytes {
						if want := int64(got.held[s]) * slot[s]; slot[s] <= 0 || b != want {
							t.Errorf("%s: stage %d: scratches of %d bytes for %d micro-batches, want %d (%d each)", name, s, b, got.held[s], want, slot[s])
						}
					}
					for s, h := range got.held {
						switch {
						case kind == pipeline.GPipe && h != m:
							t.Errorf("%s: stage %d held %d micro-batches at once, want all %d", name, s, h, m)
						case kind == pipeline.OneF1B && h > p-s:
							t.Errorf("%s: stage %d held %d micro-batches at once, want at most %d", name, s, h, p-s)
						case kind == pipeline.ZBH2 && h > 2*p-1:
							t.Errorf("%s: stage %d held %d micro-batches at once, want at most %d", name, s, h, 2*p-1)
						}
					}
				}
			}
		}
	}
}
