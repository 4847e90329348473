package placement_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	. "github.com/meshrun/meshrun/placement"
)

// bigMeshes are 3- to 6-D meshes of 64 to 1024 ranks.
var bigMeshes = []Mesh{
	MustMesh([]int{4, 16, 8}, []string{"pp", "dp", "tp"}),
	MustMesh([]int{4, 4, 4, 4}, nil),
	MustMesh([]int{2, 2, 2, 2, 2}, nil),
	MustMesh([]int{4, 2, 4, 2, 4}, nil),
	MustMesh([]int{2, 2, 2, 2, 2, 2}, nil),
	MustMesh([]int{4, 2, 2, 4, 2, 4}, nil),
}

// randomPair draws a from and to layout of a 2-D or 3-D tensor on m, with a
// partial op shared by both (Shard -> Partial avoided: it has no plan).
func randomPair(rng *rand.Rand, m Mesh) (Spec, Spec) {
	shapes := [][]int{{4096, 4096}, {1024, 4096}, {8, 2048, 1024}, {1000, 3000}}
	shape := shapes[rng.IntN(len(shapes))]
	op := ReduceOp(rng.IntN(2))
	for {
		from, to := randomSpec(rng, shape, m, op), randomSpec(rng, shape, m, op)
		ok := true
		for i := range from.Placements {
			_, s := from.Placements[i].(Shard)
			_, p := to.Placements[i].(Partial)
			ok = ok && !(s && p)
		}
		if ok {
			return from, to
		}
	}
}

// TestPlanOptimalUnderModel: A* returns a plan exactly as cheap as Dijkstra's
// (which expands every layout cheaper than the answer), on small meshes where
// Dijkstra finishes.
func TestPlanOptimalUnderModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	small := append(slices.Clone(meshes), MustMesh([]int{2, 2, 2}, nil), MustMesh([]int{4, 2, 2}, nil),
		MustMesh([]int{2, 3, 2}, nil), MustMesh([]int{2, 2, 2, 2}, nil))
	models := []Model{DefaultModel, testModel, cheapCalls, {Name: "bandwidth only", Beta: 1e9, Flops: 1, ElemBytes: 4}}
	n := 2000
	if testing.Short() {
		n = 300
	}
	var expA, expD int
	for i := 0; i < n; i++ {
		m := small[rng.IntN(len(small))]
		model := models[i%len(models)]
		from, to := randomPair(rng, m)
		a, na, errA := PlanSearch(model, from, to, true)
		d, nd, errD := PlanSearch(model, from, to, false)
		if (errA == nil) != (errD == nil) || (errA != nil && !errors.Is(errA, ErrNoPath)) {
			t.Fatalf("%s -> %s on %s: A* %v, Dijkstra %v", from, to, m, errA, errD)
		}
		if errA != nil {
			continue
		}
		if na >= MaxExpanded {
			t.Fatalf("%s -> %s on %s: A* stopped at %d layouts (the canonical plan answered)", from, to, m, na)
		}
		ta, td := model.PlanTime(a), model.PlanTime(d)
		if ta != td {
			t.Fatalf("%s -> %s on %s, model %s: A* %v (%s), Dijkstra %v (%s)", from, to, m, model.Name, ta, planString(a), td, planString(d))
		}
		expA, expD = expA+na, expD+nd
	}
	t.Logf("layouts expanded: A* %d, Dijkstra %d", expA, expD)
}

// TestPlanSearchBounded plans random redistributions on 3- to 6-D meshes of
// 64 to 1,024 ranks and checks the layouts each search expands: never more
// than MaxExpanded (a 6-D mesh has up to 9^6 layouts of a 3-D tensor), and
// the search finishes on its own (an optimal plan) in most cases.
func TestPlanSearchBounded(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	n := 300
	if testing.Short() {
		n = 60
	}
	var counts []int
	capped := 0
	start, sum := time.Now(), 0
	for i := 0; i < n; i++ {
		m := bigMeshes[i%len(bigMeshes)]
		from, to := randomPair(rng, m)
		steps, expanded, err := PlanSearch(DefaultModel, from, to, true)
		if err != nil && !errors.Is(err, ErrNoPath) {
			t.Fatalf("%s -> %s on %s: %v", from, to, m, err)
		}
		if expanded > MaxExpanded {
			t.Errorf("%s -> %s on %s: %d layouts expanded (bound %d); plan %s", from, to, m, expanded, MaxExpanded, planString(steps))
		}
		if expanded >= MaxExpanded {
			capped++
		}
		cur := from
		for _, st := range steps {
			if !st.From.Equal(cur) {
				t.Fatalf("%s -> %s: step %s starts from %s", from, to, st, st.From)
			}
			cur = st.To
		}
		if err == nil && !cur.Equal(to) {
			t.Fatalf("%s -> %s: plan ends at %s", from, to, cur)
		}
		counts = append(counts, expanded)
		sum += expanded
	}
	sort.Ints(counts)
	t.Logf("layouts expanded over %d plans: median %d, p99 %d, max %d; %v a layout; %d stopped at the bound",
		n, counts[n/2], counts[n*99/100], counts[n-1], time.Since(start)/time.Duration(sum), capped)
	if capped > n/5 {
		t.Errorf("%d of %d searches stopped at the bound", capped, n)
	}
}

// TestCanonicalPlans: the fallback plan exists exactly where a plan does, and
// moves the data right.
func TestCanonicalPlans(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	all := append(slices.Clone(meshes), MustMesh([]int{2, 2, 2}, nil), MustMesh([]int{2, 3, 2}, nil))
	for i := 0; i < 500; i++ {
		m := all[rng.IntN(len(all))]
		shape := [][]int{{8, 4}, {5, 7}, {3, 4, 6}}[rng.IntN(3)]
		op := ReduceOp(rng.IntN(2))
		from, to := randomSpec(rng, shape, m, op), randomSpec(rng, shape, m, op)
		if shardToPartial(from, to) {
			continue // refused before any search
		}
		_, err := Plan(from, to)
		c := Canonical(from, to)
		if (c != nil) != (err == nil) {
			t.Fatalf("%s -> %s on %s: canonical %v, search %v", from, to, m, planString(c), err)
		}
		if c != nil {
			checkPlan(t, from, to, c, rand.New(rand.NewPCG(1, 2)))
		}
	}
}

// BenchmarkPlanRandom plans random redistributions on 3- to 6-D meshes of 64
// to 1,024 ranks, and reports the 99th percentile of one plan's time.
func BenchmarkPlanRandom(b *testing.B) {
	for _, m := range bigMeshes {
		b.Run(m.String(), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			var times []time.Duration
			for b.Loop() {
				from, to := randomPair(rng, m)
				start := time.Now()
				if _, err := Plan(from, to); err != nil && !errors.Is(err, ErrNoPath) {
					b.Fatal(err)
				}
				times = append(times, time.Since(start))
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)*99/100].Microseconds())/1e3, "p99-ms")
		})
	}
}
