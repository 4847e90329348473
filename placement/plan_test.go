package placement_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	. "github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/placement/placementref"
)

func planString(steps []Step) string {
	var parts []string
	for _, s := range steps {
		parts = append(parts, s.String())
	}
	return strings.Join(parts, "; ")
}

// testModel prices the pinned plans: a call costs ten messages, so one
// collective over a flattened group beats two over its dims at small sizes.
var testModel = Model{Name: "test", Gamma: 20e-6, Alpha: 2e-6, Beta: 1e9, Flops: 1e10, ElemBytes: 4}

// cheapCalls has calls as cheap as messages: two small rings beat one large.
var cheapCalls = Model{Name: "cheap calls", Gamma: 1e-6, Alpha: 10e-6, Beta: 1e9, Flops: 1e10, ElemBytes: 4}

func TestPlanCases(t *testing.T) {
	m1 := MustMesh([]int{4}, []string{"tp"})
	m2 := MustMesh([]int{2, 2}, []string{"dp", "tp"})
	for _, tc := range []struct {
		name     string
		mesh     Mesh
		shape    []int
		from, to string
		want     string
	}{
		{"gather", m1, []int{8, 4}, "[S(0)]", "[R]", "all_gather(S(0)->R) on tp"},
		{"all-reduce", m1, []int{8, 4}, "[P]", "[R]", "all_reduce(P->R) on tp"},
		{"reduce-scatter not AR+slice", m1, []int{8, 4}, "[P]", "[S(0)]", "reduce_scatter(P->S(0)) on tp"},
		{"slice", m1, []int{8, 4}, "[R]", "[S(1)]", "local_slice(R->S(1)) on tp"},
		{"owner partial", m1, []int{8, 4}, "[R]", "[P]", "owner_partial(R->P) on tp"},
		{"all-to-all", m1, []int{8, 4}, "[S(0)]", "[S(1)]", "all_to_all(S(0)->S(1)) on tp"},
		{"nothing", m2, []int{8, 4}, "[S(0),R]", "[S(0),R]", ""},
		{"flattened all-reduce", m2, []int{8, 4}, "[P,P]", "[R,R]", "all_reduce(P,P->R,R) on dp+tp"},
		{"flattened gather", m2, []int{8, 4}, "[S(0),S(0)]", "[R,R]", "all_gather(S(0),S(0)->R,R) on dp+tp"},
		{"swap without full gather", m2, []int{8, 8}, "[S(0),S(1)]", "[S(1),S(0)]",
			"all_gather(S(1)->R) on tp; all_to_all(S(0)->S(1)) on dp; local_slice(R->S(0)) on tp"},
		{"avg partial", m1, []int{5}, "[P(avg)]", "[R]", "all_reduce(P(avg)->R) on tp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			from := mustSpec(t, tc.shape, tc.mesh, tc.from)
			to := mustSpec(t, tc.shape, tc.mesh, tc.to)
			steps, err := NewPlanner(testModel, DefaultBudget).Plan(context.Background(), from, to)
			if err != nil {
				t.Fatal(err)
			}
			if got := planString(steps); got != tc.want {
				t.Fatalf("plan %s -> %s:\n got %s\nwant %s", tc.from, tc.to, got, tc.want)
			}
			checkPlan(t, from, to, steps, rand.New(rand.NewPCG(1, 2)))
		})
	}
}

// TestPlanFollowsTheModel: where a call costs little next to a message, two
// all-reduces over 2 ranks (4 messages a rank) beat one over 4 (6 messages).
func TestPlanFollowsTheModel(t *testing.T) {
	m2 := MustMesh([]int{2, 2}, []string{"dp", "tp"})
	from, to := mustSpec(t, []int{8, 4}, m2, "[P,P]"), mustSpec(t, []int{8, 4}, m2, "[R,R]")
	for _, tc := range []struct {
		m    Model
		want string
	}{
		{testModel, "all_reduce(P,P->R,R) on dp+tp"},
		{cheapCalls, "all_reduce(P->R) on tp; all_reduce(P->R) on dp"},
	} {
		steps, err := NewPlanner(tc.m, DefaultBudget).Plan(context.Background(), from, to)
		if err != nil {
			t.Fatal(err)
		}
		if got := planString(steps); got != tc.want {
			t.Errorf("model %s: got %s, want %s", tc.m.Name, got, tc.want)
		}
	}
}

func TestPlanRefusesShardToPartial(t *testing.T) {
	m := MustMesh([]int{2}, nil)
	_, err := Plan(MustSpec([]int{4}, m, Shard{}), MustSpec([]int{4}, m, Partial{}))
	if !errors.Is(err, ErrNoPath) {
		t.Fatalf("S -> P: %v", err)
	}
}

func mustSpec(t testing.TB, shape []int, m Mesh, pl string) Spec {
	t.Helper()
	ps, err := ParseList(pl)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSpec(shape, m, ps...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// checkPlan runs steps on simulated ranks and checks that the tensor arrives
// intact, every step's input is what the plan says, and costs are consistent.
func checkPlan(t testing.TB, from, to Spec, steps []Step, rng *rand.Rand) {
	t.Helper()
	global := placementref.New(from.Shape...)
	for i := range global.Data {
		global.Data[i] = float64(rng.IntN(1000)) // exact in any order of sums
	}
	locals := placementref.Shard(global, from)
	cur := from
	for _, st := range steps {
		if !st.From.Equal(cur) {
			t.Fatalf("step %s starts from %s, plan is at %s", st, st.From, cur)
		}
		if st.InputElems(0) != int64(len(locals[0].Data)) {
			t.Fatalf("step %s: InputElems(0) = %d, rank 0 holds %d", st, st.InputElems(0), len(locals[0].Data))
		}
		var err error
		locals, err = placementref.Step(locals, st)
		if err != nil {
			t.Fatalf("%s: %v", st, err)
		}
		cur = st.To
	}
	if !cur.Equal(to) {
		t.Fatalf("plan ends at %s, want %s", cur, to)
	}
	got, err := placementref.Assemble(locals, to)
	if err != nil {
		t.Fatal(err)
	}
	for i := range got.Data {
		if got.Data[i] != global.Data[i] {
			t.Fatalf("%s -> %s: element %d = %g, want %g (plan %s)", from, to, i, got.Data[i], global.Data[i], planString(steps))
		}
	}
}

var meshes = []Mesh{
	MustMesh([]int{1}, nil), MustMesh([]int{2}, nil), MustMesh([]int{3}, nil), MustMesh([]int{4}, nil),
	MustMesh([]int{2, 2}, []string{"dp", "tp"}), MustMesh([]int{2, 3}, nil), MustMesh([]int{3, 2}, nil),
	MustMesh([]int{2, 1, 2}, nil),
}

func randomSpec(rng *rand.Rand, shape []int, m Mesh, op ReduceOp) Spec {
	for {
		ps := make([]Placement, m.NDim())
		for i := range ps {
			switch k := rng.IntN(4); {
			case k == 0:
				ps[i] = Replicate{}
			case k == 1:
				ps[i] = Partial{Op: op}
			default:
				ps[i] = Shard{Dim: rng.IntN(len(shape)), Split: Split(rng.IntN(4) / 3)}
			}
		}
		if s, err := NewSpec(shape, m, ps...); err == nil {
			return s
		}
	}
}

// TestPlanRandom plans between random specs on 1-D, 2-D and 3-D meshes with even,
// uneven and tiny sizes, and checks every plan on simulated ranks.
func TestPlanRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	n := 400
	if testing.Short() {
		n = 100
	}
	for i := 0; i < n; i++ {
		m := meshes[rng.IntN(len(meshes))]
		shape := []int{rng.IntN(8), 1 + rng.IntN(7)}
		if rng.IntN(3) == 0 {
			shape = append(shape, rng.IntN(5))
		}
		op := ReduceOp(rng.IntN(4))
		from, to := randomSpec(rng, shape, m, op), randomSpec(rng, shape, m, op)
		t.Run(fmt.Sprintf("%s/%s->%s", m, from, to), func(t *testing.T) {
			steps, err := Plan(from, to)
			if err != nil {
				if errors.Is(err, ErrNoPath) && shardToPartial(from, to) {
					return
				}
				t.Fatal(err)
			}
			checkPlan(t, from, to, steps, rng)
		})
	}
}

func shardToPartial(from, to Spec) bool {
	for i := range from.Placements {
		_, s := from.Placements[i].(Shard)
		_, p := to.Placements[i].(Partial)
		if s && p {
			return true
		}
	}
	return false
}

func FuzzPlan(f *testing.F) {
	f.Add(uint64(1), uint8(4), uint8(3), uint8(2))
	f.Add(uint64(99), uint8(0), uint8(1), uint8(5))
	f.Fuzz(func(t *testing.T, seed uint64, mi, d0, d1 uint8) {
		rng := rand.New(rand.NewPCG(seed, seed>>7))
		m := meshes[int(mi)%len(meshes)]
		shape := []int{int(d0 % 9), int(d1 % 9)}
		op := ReduceOp(seed % 4)
		from, to := randomSpec(rng, shape, m, op), randomSpec(rng, shape, m, op)
		steps, err := Plan(from, to)
		if err != nil {
			if shardToPartial(from, to) {
				return
			}
			t.Fatalf("%s -> %s: %v", from, to, err)
		}
		checkPlan(t, from, to, steps, rng)
	})
}

// TestCostIsSumOfSends pins Cost to the per-rank SendElems it sums, on
// uneven layouts (summed rank by rank) and on even ones (priced in closed
// form), on meshes of 1 to 3 dims.
func TestCostIsSumOfSends(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	big := []Mesh{MustMesh([]int{2, 2, 2}, nil), MustMesh([]int{4, 2, 3}, nil), MustMesh([]int{2, 4}, nil)}
	uniform := map[StepKind]int{}
	for i := 0; i < 600; i++ {
		m := meshes[rng.IntN(len(meshes))]
		shape := []int{rng.IntN(9), 1 + rng.IntN(6)}
		if i%2 == 1 {
			// Sizes every mesh dim divides, nested or not.
			m = big[rng.IntN(len(big))]
			shape = []int{48 * (1 + rng.IntN(2)), 24 * (1 + rng.IntN(3))}
			if rng.IntN(2) == 0 {
				shape = append(shape, 24)
			}
		}
		op := ReduceOp(rng.IntN(4))
		steps, err := Plan(randomSpec(rng, shape, m, op), randomSpec(rng, shape, m, op))
		if err != nil {
			continue
		}
		for _, st := range steps {
			var sum int64
			for r := 0; r < m.Size(); r++ {
				sum += st.SendElems(r)
			}
			if st.Cost() != sum {
				t.Fatalf("%s: Cost %d, sends sum to %d", st, st.Cost(), sum)
			}
			if st.Moves() && st.From.Uniform() && st.To.Uniform() {
				uniform[st.Kind]++
			}
		}
	}
	// All-to-alls on any mesh dim, between dims nested anywhere (plans only
	// move innermost shards).
	for i := 0; i < 300; i++ {
		m := big[rng.IntN(len(big))]
		shape := []int{48, 24, 24}
		from := randomSpec(rng, shape, m, Sum)
		g := rng.IntN(m.NDim())
		sh, ok := from.Placements[g].(Shard)
		if !ok {
			continue
		}
		ps := slices.Clone(from.Placements)
		ps[g] = Shard{Dim: (sh.Dim + 1 + rng.IntN(2)) % 3}
		to, err := NewSpec(shape, m, ps...)
		if err != nil {
			t.Fatal(err)
		}
		st := Step{Kind: AllToAll, MeshDims: []int{g}, Dim: sh.Dim, ToDim: ps[g].(Shard).Dim, From: from, To: to}
		var sum int64
		for r := 0; r < m.Size(); r++ {
			sum += st.SendElems(r)
		}
		if st.Cost() != sum {
			t.Fatalf("%s (%s -> %s): Cost %d, sends sum to %d", st, from, to, st.Cost(), sum)
		}
		uniform[AllToAll]++
	}
	for _, k := range []StepKind{AllGather, ReduceScatter, AllReduce, AllToAll} {
		if uniform[k] == 0 {
			t.Errorf("no %s between even layouts checked", k)
		}
	}
	t.Logf("steps between even layouts checked: %v", uniform)
}
