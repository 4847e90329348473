package spmd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/meshrun/meshrun/placement"
)

// searchModels price the comparisons: the goldens' (bandwidth and compute),
// the default (latency too), and one where calls dominate.
var searchModels = []placement.Model{
	goldenModel,
	placement.DefaultModel,
	{Name: "slow calls", Gamma: 1e-3, Alpha: 1e-5, Beta: 1e9, Flops: 1e9, ElemBytes: 4},
}

// planBoth plans req forward and backward under model with the search and
// by pricing every strategy, each plan with a planner of its own.
func planBoth(model placement.Model, req Request) (fast, brute string, st SearchStats, err error) {
	ctx := context.Background()
	run := func() (string, error) {
		fwd, err := ForwardWith(ctx, placement.NewPlanner(model, placement.DefaultBudget), req)
		if err != nil {
			return "", err
		}
		var bwd *Backward
		if _, hasP := fwd.Final.Spec.PartialOp(); !hasP {
			if bwd, err = BackwardOfWith(ctx, placement.NewPlanner(model, placement.DefaultBudget), fwd, nil, req.Dims); err != nil && !errors.Is(err, ErrGrad) {
				return "", err
			}
		}
		return Text(fwd, bwd, 4), nil
	}
	req.stats = &st
	if fast, err = run(); err != nil {
		return
	}
	exhaustive = true
	defer func() { exhaustive = false }()
	brute, err = run()
	return
}

// TestSearchMatchesBruteForce plans every op for random placements on 1-, 2-
// and 3-D meshes under several models, with the search and by pricing every
// strategy: the plans, forward and backward, are the same (the same
// strategies, equal ones resolved alike), so the search's pick has the least
// modelled cost.
func TestSearchMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 8))
	meshes := append(slices.Clone(testMeshes), "2x2x2", "2x1x2", "4x2x2")
	n := 300
	if testing.Short() {
		n = 60
	}
	var strategies, priced int
	for i := 0; i < n; i++ {
		op := Ops()[rng.IntN(len(Ops()))]
		m, _ := placement.ParseMesh(meshes[rng.IntN(len(meshes))])
		shapes, dims := randomShapes(rng, op, m)
		if rng.IntN(2) == 0 { // large layers too, where compute weighs
			for _, sh := range shapes {
				for d := range sh {
					if sh[d] > 1 {
						sh[d] *= 256
					}
				}
			}
		}
		req := Request{Op: op, Dims: dims}
		for j, sh := range shapes {
			req.Inputs = append(req.Inputs, Operand{Name: rules[op].inputs[j], Spec: placement.MustSpec(sh, m, randomPlacements(rng, m, len(sh), rng.IntN(3) == 0)...)})
		}
		model := searchModels[i%len(searchModels)]
		fast, brute, st, err := planBoth(model, req)
		if err != nil {
			if errors.Is(err, ErrNoRule) || errors.Is(err, ErrGrad) {
				continue
			}
			t.Fatalf("%s on %s: %v", describe(op, req.Inputs), m, err)
		}
		if fast != brute {
			t.Fatalf("%s on %s, model %s: the search and brute force differ\n--- search\n%s\n--- brute force\n%s", describe(op, req.Inputs), m, model.Name, fast, brute)
		}
		strategies += st.Strategies
		priced += st.Priced
	}
	t.Logf("forward strategies: %d in all, %d priced", strategies, priced)
}

// bigMeshes are 3- to 6-D meshes of 64 to 1024 ranks.
var bigMeshes = []string{"pp=4,dp=16,tp=8", "a=4,b=4,c=4,d=4", "2x2x2x2x2", "4x2x4x2x4", "2x2x2x2x2x2", "4x2x2x4x2x4"}

// randomBig draws a linear layer of realistic sizes with random placements
// on m.
func randomBig(rng *rand.Rand, m placement.Mesh) Request {
	tokens, in, out := []int{1024, 4096, 8192}[rng.IntN(3)], []int{1024, 4096}[rng.IntN(2)], []int{1024, 4096, 11008}[rng.IntN(3)]
	x := []int{tokens, in}
	if rng.IntN(3) == 0 {
		x = []int{8, tokens, in}
	}
	req := Request{Op: "linear"}
	for j, sh := range [][]int{x, {out, in}, {out}} {
		req.Inputs = append(req.Inputs, Operand{Name: rules["linear"].inputs[j], Spec: placement.MustSpec(sh, m, randomPlacements(rng, m, len(sh), rng.IntN(4) == 0)...)})
	}
	return req
}

// maxPriced bounds the strategies one search prices (a 6-D mesh has 5^6 =
// 15,625 strategies of a linear layer).
const maxPriced = 1000

// TestSearchBounded plans random linear layers on 3- and 4-D meshes of 64
// to 512 ranks: each search prices a bounded number of strategies. (On 5-
// and 6-D meshes some random layouts exceed the default planning budget:
// BenchmarkPlanOp measures them.)
func TestSearchBounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 9))
	n := 20
	if testing.Short() {
		n = 6
	}
	var counts []int
	for i := 0; i < n; i++ {
		m, _ := placement.ParseMesh(bigMeshes[i%2])
		req := randomBig(rng, m)
		var st SearchStats
		req.stats = &st
		if _, err := Forward(req); err != nil {
			t.Fatalf("%s on %s: %v", describe("linear", req.Inputs), m, err)
		}
		if st.Priced > maxPriced {
			t.Errorf("%s on %s: %d of %d strategies priced", describe("linear", req.Inputs), m, st.Priced, st.Strategies)
		}
		counts = append(counts, st.Priced)
	}
	slices.Sort(counts)
	t.Logf("strategies priced: median %d, max %d", counts[len(counts)/2], counts[len(counts)-1])
}

// BenchmarkPlanOp plans random linear layers, forward and backward, on 3- to
// 6-D meshes of 64 to 1,024 ranks and reports the 99th percentile of one
// layer's planning time, and fixed cases (3-D activations on 2x2x2, and one
// 4096x4096 layer on 3-, 4- and 5-D meshes).
func BenchmarkPlanOp(b *testing.B) {
	fixed := []struct{ mesh, x, w string }{
		{"a=2,b=2,c=2", "16x8x32:[S(0),S(1),R]", "64x32:[R,R,S(0)]"},
		{"pp=4,dp=16,tp=8", "4096x4096:[R,S(0),R]", "4096x4096:[R,R,S(0)]"},
		{"a=4,b=4,c=4,d=4", "4096x4096:[R,S(0),R,R]", "4096x4096:[R,R,S(0),R]"},
		{"a=2,b=2,c=2,d=2,e=2", "4096x4096:[R,S(0),R,R,R]", "4096x4096:[R,R,S(0),R,R]"},
	}
	for _, f := range fixed {
		b.Run(f.mesh, func(b *testing.B) {
			req := linearRequest(b, f.mesh, f.x, f.w)
			for b.Loop() {
				fwd, err := Forward(req)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := BackwardOf(fwd, nil, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, mesh := range bigMeshes {
		b.Run("random/"+mesh, func(b *testing.B) {
			m, _ := placement.ParseMesh(mesh)
			rng := rand.New(rand.NewPCG(1, 1))
			var times []time.Duration
			refused := 0
			for b.Loop() {
				d, ok := planRandom(b, rng, m)
				times = append(times, d)
				if !ok {
					refused++
				}
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1e3, "median-ms")
			b.ReportMetric(float64(times[len(times)*99/100].Microseconds())/1e3, "p99-ms")
			b.ReportMetric(float64(refused)/float64(len(times)), "refused/op")
		})
	}
}

// planRandom plans a random linear layer on m forward and backward, and
// returns how long it took and whether it fitted the planning budget.
func planRandom(b *testing.B, rng *rand.Rand, m placement.Mesh) (time.Duration, bool) {
	req := randomBig(rng, m)
	start := time.Now()
	fwd, err := Forward(req)
	if err == nil {
		_, err = BackwardOf(fwd, nil, nil)
	}
	d := time.Since(start)
	if err != nil && !errors.Is(err, placement.ErrBudget) && !errors.Is(err, ErrGrad) {
		b.Fatal(fmt.Errorf("%s: %w", describe("linear", req.Inputs), err))
	}
	return d, !errors.Is(err, placement.ErrBudget)
}

// BenchmarkPlanModel plans a 100-layer transformer's linear layers forward
// and backward on pp=4,dp=16,tp=8 (Megatron's layout: attention's qkv and
// the first MLP layer split by columns on tp, the output projection and the
// second MLP layer by rows, activations split by data parallelism), with a
// new planner each time: each distinct layer is planned once.
func BenchmarkPlanModel(b *testing.B) {
	const mesh, tokens, hidden, ffn = "pp=4,dp=16,tp=8", 8192, 4096, 11008
	layer := []struct{ x, w string }{
		{fmt.Sprintf("%dx%d:[R,S(0),R]", tokens, hidden), fmt.Sprintf("%dx%d:[R,R,S(0)]", 3*hidden, hidden)},
		{fmt.Sprintf("%dx%d:[R,S(0),S(1)]", tokens, hidden), fmt.Sprintf("%dx%d:[R,R,S(1)]", hidden, hidden)},
		{fmt.Sprintf("%dx%d:[R,S(0),R]", tokens, hidden), fmt.Sprintf("%dx%d:[R,R,S(0)]", ffn, hidden)},
		{fmt.Sprintf("%dx%d:[R,S(0),S(1)]", tokens, ffn), fmt.Sprintf("%dx%d:[R,R,S(1)]", hidden, ffn)},
	}
	var reqs []Request
	for _, l := range layer {
		reqs = append(reqs, linearRequest(b, mesh, l.x, l.w))
	}
	ctx := context.Background()
	for b.Loop() {
		pl := placement.DefaultPlanner()
		for range 100 {
			for _, req := range reqs {
				fwd, err := ForwardWith(ctx, pl.WithBudget(placement.DefaultBudget), req)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := BackwardOfWith(ctx, pl.WithBudget(placement.DefaultBudget), fwd, nil, nil); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
}
