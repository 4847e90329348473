package spmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd/spmdtest"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// goldenCase is one block of a golden file: a header of "key: value" lines, a
// line "----", and the plan as Text renders it.
type goldenCase struct {
	name   string
	header map[string]string
	want   string
}

func readGolden(t *testing.T, path string) []goldenCase {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cases []goldenCase
	for _, block := range strings.Split(string(data), "\n====\n") {
		block = strings.TrimSpace(block)
		if block == "" {
			continue
		}
		head, want, _ := strings.Cut(block, "\n----\n")
		c := goldenCase{header: map[string]string{}, want: strings.TrimSpace(want)}
		for _, line := range strings.Split(head, "\n") {
			if name, ok := strings.CutPrefix(line, "# "); ok {
				c.name = name
				continue
			}
			k, v, _ := strings.Cut(line, ":")
			c.header[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
		cases = append(cases, c)
	}
	return cases
}

func writeGolden(t *testing.T, path string, cases []goldenCase) {
	var b strings.Builder
	for i, c := range cases {
		if i > 0 {
			b.WriteString("\n====\n")
		}
		fmt.Fprintf(&b, "# %s\n", c.name)
		for _, k := range []string{"mesh", "op", "in", "dims", "out", "grads", "explain"} {
			if v, ok := c.header[k]; ok {
				fmt.Fprintf(&b, "%s: %s\n", k, v)
			}
		}
		b.WriteString("----\n")
		b.WriteString(c.want)
		b.WriteString("\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// goldenModel prices the golden plans: small tensors in the proportions of
// large layers (spmdtest.LargeLayers). A header "model: default" plans with
// DefaultModel instead.
var goldenModel = spmdtest.LargeLayers

// planCase builds the plans a golden header describes.
func planCase(h map[string]string) (*Plan, *Backward, error) {
	pl := placement.NewPlanner(goldenModel, placement.DefaultBudget)
	if h["model"] == "default" {
		pl = placement.DefaultPlanner()
	}
	mesh, err := placement.ParseMesh(h["mesh"])
	if err != nil {
		return nil, nil, err
	}
	req := Request{Op: h["op"]}
	for _, f := range strings.Fields(h["in"]) {
		name, spec, _ := strings.Cut(f, "=")
		s, err := placement.ParseSpec(spec, mesh)
		if err != nil {
			return nil, nil, err
		}
		req.Inputs = append(req.Inputs, Operand{Name: name, Spec: s})
	}
	if v, ok := h["dims"]; ok {
		for _, d := range strings.Split(v, ",") {
			n, _ := strconv.Atoi(d)
			req.Dims = append(req.Dims, n)
		}
	}
	if v, ok := h["out"]; ok {
		if req.Out, err = placement.ParseList(v); err != nil {
			return nil, nil, err
		}
	}
	if v, ok := h["explain"]; ok {
		if req.Explain, err = strconv.Atoi(v); err != nil {
			return nil, nil, err
		}
	}
	var grads []string
	if v, ok := h["grads"]; ok {
		grads = []string{}
		if v != "none" {
			grads = strings.Split(v, ",")
		}
	}
	req.Grads = grads
	ctx := context.Background()
	fwd, err := ForwardWith(ctx, pl, req)
	if err != nil {
		return nil, nil, err
	}
	bwd, err := BackwardOfWith(ctx, pl.WithBudget(placement.DefaultBudget), fwd, grads, req.Dims)
	return fwd, bwd, err
}

func TestGolden(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.txt")
	if len(files) == 0 {
		t.Fatal("no golden files")
	}
	for _, path := range files {
		cases := readGolden(t, path)
		for i, c := range cases {
			t.Run(filepath.Base(path)+"/"+c.name, func(t *testing.T) {
				fwd, bwd, err := planCase(c.header)
				var got string
				if err != nil {
					got = "error: " + err.Error()
				} else {
					got = strings.TrimSpace(Text(fwd, bwd, 4))
					if err := checkNumerically(rand.New(rand.NewPCG(uint64(i), 3)), fwd, bwd); err != nil {
						t.Errorf("numerical check: %v", err)
					}
				}
				if *update {
					cases[i].want = got
					return
				}
				if got != c.want {
					t.Errorf("plan differs from %s.\n--- got\n%s\n--- want\n%s", path, got, c.want)
				}
			})
		}
		if *update {
			writeGolden(t, path, cases)
		}
	}
}

var testMeshes = []string{"1", "2", "3", "4", "dp=2,tp=2", "2x3", "3x2"}

func randomPlacements(rng *rand.Rand, m placement.Mesh, rank int, allowPartial bool) []placement.Placement {
	ps := make([]placement.Placement, m.NDim())
	// Sum most often; avg, max and min too (max and min inputs are reduced
	// before the op, and their gradients refused).
	op := []placement.ReduceOp{placement.Sum, placement.Sum, placement.Avg, placement.Max, placement.Min}[rng.IntN(5)]
	for i := range ps {
		switch k := rng.IntN(5); {
		case k == 0:
			ps[i] = placement.Replicate{}
		case k == 1 && allowPartial:
			ps[i] = placement.Partial{Op: op}
		case rank == 0:
			ps[i] = placement.Replicate{}
		default:
			ps[i] = placement.Shard{Dim: rng.IntN(rank), Split: placement.Split(rng.IntN(5) / 4)}
		}
	}
	return ps
}

// sizes picks a dim size around the mesh dims: P-1, P, P+1, a prime, 1.
func size(rng *rand.Rand, m placement.Mesh) int {
	p := m.Size()
	return []int{max(p-1, 1), p, p + 1, 7, 1, 2 * p}[rng.IntN(6)]
}

// TestRulesNumerically plans every op for random placements on 1-D and 2-D meshes
// (P = 1..4, even and uneven sizes) and runs forward and every gradient on
// simulated ranks against the unsharded float64 result.
func TestRulesNumerically(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 42))
	perOp := 60
	if testing.Short() {
		perOp = 15
	}
	for _, op := range Ops() {
		for n := 0; n < perOp; n++ {
			m, _ := placement.ParseMesh(testMeshes[rng.IntN(len(testMeshes))])
			shapes, dims := randomShapes(rng, op, m)
			req := Request{Op: op, Dims: dims}
			for j, sh := range shapes {
				// Partial inputs only where the reference can shard them exactly.
				ps := randomPlacements(rng, m, len(sh), rng.IntN(3) == 0)
				req.Inputs = append(req.Inputs, Operand{Name: rules[op].inputs[j], Spec: placement.MustSpec(sh, m, ps...)})
			}
			name := fmt.Sprintf("%s/%s/%s", op, m, describe(op, req.Inputs))
			t.Run(name, func(t *testing.T) {
				fwd, err := Forward(req)
				if err != nil {
					t.Fatal(err)
				}
				var bwd *Backward
				if _, hasP := fwd.Final.Spec.PartialOp(); !hasP {
					if bwd, err = BackwardOf(fwd, nil, dims); err != nil && !errors.Is(err, ErrGrad) {
						t.Fatal(err)
					}
				}
				if err := checkNumerically(rng, fwd, bwd); err != nil {
					t.Fatalf("%v\n%s", err, Text(fwd, bwd, 4))
				}
			})
		}
	}
}

func randomShapes(rng *rand.Rand, op string, m placement.Mesh) ([][]int, []int) {
	s := func() int { return size(rng, m) }
	switch op {
	case "linear":
		n := s()
		x := []int{s(), s()}
		if rng.IntN(3) == 0 {
			x = []int{s(), s(), x[1]}
		}
		return [][]int{x, {n, x[len(x)-1]}, {n}}, nil
	case "linear_nobias":
		x := []int{s(), s()}
		return [][]int{x, {s(), x[1]}}, nil
	case "matmul":
		b, mm, k, n := s(), s(), s(), s()
		switch rng.IntN(3) {
		case 0:
			return [][]int{{b, mm, k}, {k, n}}, nil
		case 1:
			return [][]int{{b, mm, k}, {1, k, n}}, nil
		}
		return [][]int{{b, mm, k}, {b, k, n}}, nil
	case "add":
		a := []int{s(), s()}
		switch rng.IntN(3) {
		case 0:
			return [][]int{a, {a[1]}}, nil
		case 1:
			return [][]int{a, {1, a[1]}}, nil
		}
		return [][]int{a, a}, nil
	case "layernorm":
		x := []int{s(), s()}
		if rng.IntN(2) == 0 {
			x = []int{s(), s(), x[1]}
		}
		d := x[len(x)-1]
		return [][]int{x, {d}, {d}}, nil
	case "softmax":
		x := []int{s(), s(), s()}
		switch rng.IntN(3) {
		case 0:
			return [][]int{x}, []int{0}
		case 1:
			return [][]int{x}, []int{1}
		}
		return [][]int{x}, nil
	case "attention":
		b, h, sq, e := s(), s(), s(), s()
		return [][]int{{b, sq, h, e}, {b, sq, h, e}, {b, sq, h, s()}}, nil
	case "amax":
		a := []int{s(), s(), s()}
		switch rng.IntN(3) {
		case 0:
			return [][]int{a}, []int{2}
		case 1:
			return [][]int{a}, []int{0, 1}
		}
		return [][]int{a}, nil
	case "sumexp", "pick":
		x := []int{s(), s(), s()}
		return [][]int{x, {x[0], x[1]}}, nil
	case "embedding":
		ids := []int{s(), s()}
		if rng.IntN(2) == 0 {
			ids = ids[:1]
		}
		return [][]int{ids, {s() + 2, s()}}, nil
	case "sum":
		a := []int{s(), s(), s()}
		switch rng.IntN(3) {
		case 0:
			return [][]int{a}, []int{0}
		case 1:
			return [][]int{a}, []int{1, 2}
		}
		return [][]int{a}, nil
	}
	return [][]int{{s(), s()}}, nil
}

func TestErrors(t *testing.T) {
	m := placement.MustMesh([]int{2, 2}, []string{"dp", "tp"})
	m4 := placement.MustMesh([]int{4}, nil)
	spec := func(s string, mesh placement.Mesh) placement.Spec {
		sp, err := placement.ParseSpec(s, mesh)
		if err != nil {
			t.Fatal(err)
		}
		return sp
	}
	for _, tc := range []struct {
		name string
		req  Request
		want error
		text string
	}{
		{"unknown op", Request{Op: "conv"}, ErrNoRule, "conv"},
		{"wrong K", Request{Op: "linear", Inputs: []Operand{{Name: "x", Spec: spec("8x16:[R,R]", m)}, {Name: "w", Spec: spec("32x15:[R,R]", m)}, {Name: "b", Spec: spec("32:[R,R]", m)}}}, ErrShape, "linear x=8x16:[R,R] w=32x15:[R,R] b=32:[R,R]"},
		{"wrong bias", Request{Op: "linear", Inputs: []Operand{{Name: "x", Spec: spec("8x16:[R,R]", m)}, {Name: "w", Spec: spec("32x16:[R,R]", m)}, {Name: "b", Spec: spec("31:[R,R]", m)}}}, ErrShape, "31"},
		{"mesh differs", Request{Op: "matmul", Inputs: []Operand{{Name: "a", Spec: spec("8x16:[R,R]", m)}, {Name: "b", Spec: spec("16x4:[R]", m4)}}}, ErrMesh, "mesh"},
		{"inputs missing", Request{Op: "linear", Inputs: []Operand{{Name: "x", Spec: spec("8x16:[R,R]", m)}}}, ErrNoRule, "3 inputs"},
		{"out on wrong mesh", Request{Op: "gelu", Inputs: []Operand{{Name: "x", Spec: spec("8x16:[R,R]", m)}}, Options: Options{Out: []placement.Placement{placement.Replicate{}}}}, ErrNoRule, "output placements"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Forward(tc.req)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("error %v, want %v mentioning %q", err, tc.want, tc.text)
			}
		})
	}
	fwd, err := Forward(Request{Op: "gelu", Inputs: []Operand{{Name: "x", Spec: spec("8x16:[R,R]", m)}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := BackwardOf(fwd, []string{"w"}, nil); !errors.Is(err, ErrGrad) {
		t.Fatalf("unknown grad: %v", err)
	}
}

// TestSkippedGradCostsNothing: a gradient not asked for has no plan and no collective.
func TestSkippedGradCostsNothing(t *testing.T) {
	m := placement.MustMesh([]int{4}, nil)
	in := []Operand{
		{Name: "x", Spec: placement.MustSpec([]int{8, 16}, m, placement.Replicate{})},
		{Name: "w", Spec: placement.MustSpec([]int{32, 16}, m, placement.Shard{Dim: 0})},
		{Name: "b", Spec: placement.MustSpec([]int{32}, m, placement.Shard{Dim: 0})},
	}
	fwd, err := Forward(Request{Op: "linear", Inputs: in})
	if err != nil {
		t.Fatal(err)
	}
	all, _ := BackwardOf(fwd, nil, nil)
	some, _ := BackwardOf(fwd, []string{"w", "b"}, nil)
	if len(all.Collectives()) != 1 || all.Collectives()[0].Tensor != "dx" {
		t.Fatalf("column parallel backward: want one all-reduce of dx, got %v", all.Collectives())
	}
	if len(some.Grads) != 2 || len(some.Collectives()) != 0 {
		t.Fatalf("without dx: %d grads, %d collectives", len(some.Grads), len(some.Collectives()))
	}
}

// TestExplain: asking for runners-up changes nothing in the plan; the chosen
// candidate is the plan's strategy, and the runners-up come in the order the
// engine ranks them (modelled time, then collectives, memory, steps), none
// cheaper.
func TestExplain(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for n := 0; n < 40; n++ {
		op := Ops()[rng.IntN(len(Ops()))]
		m, _ := placement.ParseMesh(testMeshes[rng.IntN(len(testMeshes))])
		shapes, dims := randomShapes(rng, op, m)
		req := Request{Op: op, Dims: dims}
		for j, sh := range shapes {
			req.Inputs = append(req.Inputs, Operand{Name: rules[op].inputs[j], Spec: placement.MustSpec(sh, m, randomPlacements(rng, m, len(sh), false)...)})
		}
		plain, err := Forward(req)
		if err != nil {
			t.Fatal(err)
		}
		req.Explain = 5
		ex, err := Forward(req)
		if err != nil {
			t.Fatal(err)
		}
		if Text(plain, nil, 4) != strings.Split(Text(ex, nil, 4), "explain:")[0] {
			t.Fatalf("%s: explain changed the plan", describe(op, req.Inputs))
		}
		if ex.Chosen == nil || strings.Join(ex.Chosen.Strategy, "; ") != strings.Join(ex.Strategy, "; ") || ex.Chosen.Cost != ex.Cost {
			t.Fatalf("%s: chosen %+v, plan %v cost %d", describe(op, req.Inputs), ex.Chosen, ex.Strategy, ex.Cost)
		}
		prev := *ex.Chosen
		for _, c := range append([]Candidate(nil), ex.RunnersUp...) {
			a, b := c.Costs, prev.Costs
			if a.Time < b.Time || a.Time == b.Time && (c.Collectives < prev.Collectives ||
				c.Collectives == prev.Collectives && (a.Memory < b.Memory || a.Memory == b.Memory && c.Steps < prev.Steps)) {
				t.Fatalf("%s: runner-up %+v ranks before %+v", describe(op, req.Inputs), c, prev)
			}
			prev = c
		}
		if len(ex.RunnersUp) > 5 {
			t.Fatalf("%d runners-up, asked for 5", len(ex.RunnersUp))
		}
	}
}
