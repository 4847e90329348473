package job

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// verifyCase is one layer layout and size to check.
type verifyCase struct {
	mesh    placement.Mesh
	cfg     linear.Config
	plans   linear.Plans
	sizes   string
	seed    uint64
	command string // `worker linear ...` reproducing it
}

// Meshes lists every 1-D, 2-D and 3-D mesh of world ranks (each dim of at
// least 2): tp=W, then dp=a,tp=b, then dp=a,cp=b,tp=c.
func Meshes(world int) []placement.Mesh {
	return meshesOf(world, "tp", [][2]string{{"dp", "tp"}}, [3]string{"dp", "cp", "tp"})
}

// meshesOf lists the meshes of world ranks a verify row runs on, each dim
// of at least 2: the 1-D mesh named one, then for every factorization a·b
// the 2-D meshes named by each pair of two, then for every a·b·c the 3-D
// mesh named three.
func meshesOf(world int, one string, two [][2]string, three [3]string) []placement.Mesh {
	out := []placement.Mesh{placement.MustMesh([]int{world}, []string{one})}
	for a := 2; a <= world/2; a++ {
		if world%a == 0 {
			for _, n := range two {
				out = append(out, placement.MustMesh([]int{a, world / a}, n[:]))
			}
		}
	}
	for a := 2; a <= world/4; a++ {
		for b := 2; a*b <= world/2; b++ {
			if world%(a*b) == 0 {
				out = append(out, placement.MustMesh([]int{a, b, world / (a * b)}, three[:]))
			}
		}
	}
	return out
}

// linearCases enumerates, for a mesh, every placement of x (R, S(0), S(1), P),
// W (R, S(0), S(1)) and b (R, S(0)) per mesh dim, at even sizes (multiples of
// the mesh size) and uneven ones (P+1 tokens, P-1 features in, a prime out).
// quick keeps the uneven sizes and drops partial inputs.
func linearCases(planner *placement.Planner, m placement.Mesh, quick bool) []verifyCase {
	p := m.Size()
	type size struct {
		name    string
		m, k, n int
	}
	sizes := []size{{"even", 2 * p, 2 * p, 4 * p}, {"uneven", p + 1, max(p-1, 1), 7}}
	xs := []string{"R", "S(0)", "S(1)", "P"}
	if quick {
		sizes, xs = sizes[1:], xs[:3]
	}
	ws, bs := []string{"R", "S(0)", "S(1)"}, []string{"R", "S(0)"}
	// Every combination of one (x, w, b) choice per mesh dim.
	type choice struct{ x, w, b string }
	var per []choice
	for _, x := range xs {
		for _, w := range ws {
			for _, b := range bs {
				per = append(per, choice{x, w, b})
			}
		}
	}
	// 1-D and 2-D meshes: every combination; 3-D: a fixed sample.
	limit := math.MaxInt
	if m.NDim() > 2 {
		limit = linearSample(quick)
	}
	var layouts [][]choice
	for _, idx := range combos(len(per), m.NDim(), limit, rand.New(rand.NewPCG(uint64(m.Size()), uint64(m.NDim())))) {
		c := make([]choice, len(idx))
		for i, k := range idx {
			c[i] = per[k]
		}
		layouts = append(layouts, c)
	}
	var out []verifyCase
	for _, sz := range sizes {
		for _, combo := range layouts {
			pl := func(get func(choice) string) string {
				parts := make([]string, len(combo))
				for i, c := range combo {
					parts[i] = get(c)
				}
				return "[" + strings.Join(parts, ",") + "]"
			}
			x := fmt.Sprintf("%dx%d:%s", sz.m, sz.k, pl(func(c choice) string { return c.x }))
			w := fmt.Sprintf("%dx%d:%s", sz.n, sz.k, pl(func(c choice) string { return c.w }))
			b := fmt.Sprintf("%d:%s", sz.n, pl(func(c choice) string { return c.b }))
			seed := uint64(len(out) + 1)
			a := linearArgs{mesh: m.String(), x: x, w: w, b: b, grads: "x,w,b", seed: seed, planner: planner.WithBudget(placement.DefaultBudget)}
			cfg, plans, err := a.plan(context.Background())
			if err != nil {
				continue // a layout the rules refuse is not a case
			}
			out = append(out, verifyCase{mesh: m, cfg: cfg, plans: plans, sizes: sz.name, seed: seed,
				command: fmt.Sprintf("worker linear --mesh %s --x '%s' --w '%s' --b '%s' --seed %d", m, x, w, b, seed)})
		}
	}
	return out
}

// linearSample is how many layouts of linear verify checks on a 3-D mesh (at
// each size), out of 18³ (quick) or 24³: planning 3-D layouts is most of
// verify's time (4096 took 8 minutes at world 8 on two cores).
func linearSample(quick bool) int {
	if quick {
		return 512
	}
	return 1024
}

// layerRow is a layer checked whole (ring attention, the mixture of
// experts) on one mesh: its cases, each run on every rank.
type layerRow struct {
	op    string
	mesh  placement.Mesh
	cases []layerCase
}

// layerCase is one case of a layerRow: what reproduces it, and its run on
// this rank (rank 0 judges it).
type layerCase struct {
	command string
	run     func(ctx context.Context, w *collective.World, k kernels.Compute) (bool, string, error)
}

// verifyRow is one line of the table.
type verifyRow struct {
	op, mesh      string
	cases, passed int
	failures      []string
}

func (r *verifyRow) add(ok bool, why, command string) {
	r.cases++
	if ok {
		r.passed++
	} else {
		r.failures = append(r.failures, why+"\n    "+command)
	}
}

// verifyTask is `worker verify`.
type verifyTask struct {
	ops   string
	quick bool
	world int
	df    deviceFlags
	n     int // ranks
	rd    rankDevice
}

func (t *verifyTask) flags(fs *flag.FlagSet) {
	fs.StringVar(&t.ops, "ops", strings.Join(verifyOps, ","), "`OPS` to verify, some of: "+strings.Join(verifyOps, ", ")+
		" (linear through the layer in --dtype; moe through the mixture-of-experts layer in float32 on meshes of dp, ep and tp; ring: ring attention in float32 on meshes of dp, cp and tp (cpu); the others through their plans in float64)")
	fs.BoolVar(&t.quick, "quick", false, "uneven sizes only, no partial inputs to linear, one shape per op, fewer sampled layouts")
	fs.IntVar(&t.world, "world", 0, "world size when run alone (default $WORLD_SIZE, else 4)")
	t.df.register(fs)
}

func (t *verifyTask) setup(_ context.Context, env Env, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	for _, op := range strings.Split(t.ops, ",") {
		if !slices.Contains(verifyOps, op) {
			return fmt.Errorf("--ops: unknown op %q (known: %s)", op, strings.Join(verifyOps, ", "))
		}
	}
	t.n = worldSize(env, 4)
	if t.world < 0 {
		return fmt.Errorf("--world %d: want a positive number", t.world)
	}
	if t.world > 0 {
		if env.Getenv("WORLD_SIZE") != "" && t.world != t.n {
			return fmt.Errorf("--world %d, but the job has %d ranks", t.world, t.n)
		}
		t.n = t.world
	}
	if t.n > placement.MaxDevices {
		return fmt.Errorf("--world %d: more than the %d ranks a mesh may hold", t.n, placement.MaxDevices)
	}
	var err error
	if t.rd, err = t.df.resolve(env); err != nil {
		return err
	}
	// The largest case: even sizes, x [2P, 2P] and w [4P, 2P].
	p := t.n
	need, parts, err := linearMemory([]int{2 * p, 2 * p}, 4*p)
	if err != nil {
		return fmt.Errorf("%d ranks: %w", t.n, err)
	}
	return checkMemory(env, t.rd.kind, need, parts, ranksHere(env, t.n))
}

func (t *verifyTask) run(ctx context.Context, env Env) int {
	n, rd := t.n, t.rd
	// The cases (and their plans) are the same on every rank: build them once.
	meshes := Meshes(n)
	ops := strings.Split(t.ops, ",")
	doLinear := slices.Contains(ops, "linear")
	cases := make([][]verifyCase, len(meshes))
	// others are the ops besides linear, in verifyOps' order.
	var others []string
	for _, op := range verifyOps {
		if op != "linear" && op != "moe" && op != "ring" && slices.Contains(ops, op) {
			others = append(others, op)
		}
	}
	// Planning the cases is pure and most of verify's work on 3-D meshes: plan
	// them on every core. opCasesOf[i][k] are the cases of others[k] on mesh i.
	opCasesOf := make([][][]opCase, len(meshes))
	// One planner for them all, each plan within a budget of its own: a plan
	// repeated is made once.
	pl := placement.DefaultPlanner()
	var plan []func()
	for i, m := range meshes {
		opCasesOf[i] = make([][]opCase, len(others))
		for o, op := range others {
			plan = append(plan, func() { opCasesOf[i][o] = opCases(ctx, pl, op, m, t.quick) })
		}
		if doLinear {
			plan = append(plan, func() { cases[i] = linearCases(pl, m, t.quick) })
		}
	}
	parallel(plan)
	// The layers checked whole, a row per mesh: ring attention (on host
	// tensors: verify's cpu ranks), then the mixture of experts.
	var layerRows []layerRow
	if slices.Contains(ops, "ring") && rd.kind == tensor.CPU {
		for _, m := range ringMeshes(n) {
			lr := layerRow{op: "ring", mesh: m}
			for _, c := range ringCases(m, t.quick) {
				lr.cases = append(lr.cases, layerCase{c.command, func(ctx context.Context, w *collective.World, k kernels.Compute) (bool, string, error) {
					return runRingCase(ctx, w, k, c)
				}})
			}
			layerRows = append(layerRows, lr)
		}
	}
	if slices.Contains(ops, "moe") {
		for _, m := range moeMeshes(n) {
			cs, err := moeCases(m, t.quick)
			if err != nil {
				return failure(env, "verify", err)
			}
			lr := layerRow{op: "moe", mesh: m}
			for _, c := range cs {
				lr.cases = append(lr.cases, layerCase{c.command, func(ctx context.Context, w *collective.World, k kernels.Compute) (bool, string, error) {
					return runMoECase(ctx, w, k, c)
				}})
			}
			layerRows = append(layerRows, lr)
		}
	}
	for i := range cases {
		for j := range cases[i] {
			cases[i][j].cfg.DType = rd.dtype
			if rd.dtype != tensor.Float32 {
				cases[i][j].command += " --dtype " + rd.dtype.String()
			}
		}
	}
	var rows []verifyRow
	var mu sync.Mutex
	err := ranks(ctx, env, n, func(ctx context.Context, w *collective.World) error {
		k, err := rd.build()
		if err != nil {
			return err
		}
		for i, m := range meshes {
			if doLinear {
				row := verifyRow{op: "linear", mesh: m.String()}
				for _, c := range cases[i] {
					ok, why, err := runVerifyCase(ctx, w, k, c)
					if err != nil {
						return fmt.Errorf("%s: %w", c.command, err)
					}
					row.add(ok, why, c.command)
				}
				if w.Rank() == 0 {
					mu.Lock()
					rows = append(rows, row)
					mu.Unlock()
				}
			}
			for o, op := range others {
				row := verifyRow{op: op, mesh: m.String()}
				for _, c := range opCasesOf[i][o] {
					ok, why, err := runOpCase(ctx, w, c)
					if err != nil {
						return fmt.Errorf("%s: %w", c.command, err)
					}
					row.add(ok, why, fmt.Sprintf("%s (its plan; worker verify --ops %s --world %d runs it)", c.command, op, n))
				}
				if w.Rank() == 0 {
					mu.Lock()
					rows = append(rows, row)
					mu.Unlock()
				}
			}
		}
		for _, lr := range layerRows {
			row := verifyRow{op: lr.op, mesh: lr.mesh.String()}
			for _, c := range lr.cases {
				ok, why, err := c.run(ctx, w, k)
				if err != nil {
					return fmt.Errorf("%s on %s, %s: %w", lr.op, lr.mesh, c.command, err)
				}
				row.add(ok, why, fmt.Sprintf("%s on %s, %s (worker verify --ops %s --world %d runs it)", lr.op, lr.mesh, c.command, lr.op, n))
			}
			if w.Rank() == 0 {
				mu.Lock()
				rows = append(rows, row)
				mu.Unlock()
			}
		}
		return nil
	})
	if err != nil {
		return failure(env, "verify", err)
	}
	if rows == nil {
		return 0 // not rank 0
	}
	fmt.Fprintf(env.Stdout, "%-10s %-16s %7s %7s %7s\n", "op", "mesh", "cases", "passed", "failed")
	failed := 0
	for _, r := range rows {
		fmt.Fprintf(env.Stdout, "%-10s %-16s %7d %7d %7d\n", r.op, r.mesh, r.cases, r.passed, len(r.failures))
		failed += len(r.failures)
	}
	for _, r := range rows {
		for _, f := range r.failures {
			fmt.Fprintf(env.Stdout, "FAIL %s\n", f)
		}
	}
	if failed > 0 {
		return 1
	}
	return 0
}

// runVerifyCase runs one case on this rank; rank 0 judges it.
func runVerifyCase(ctx context.Context, w *collective.World, k kernels.Compute, c verifyCase) (bool, string, error) {
	data := linear.RandomData(c.cfg.X.Shape, c.cfg.W.Shape[0], c.cfg.B != nil, c.seed)
	if err := data.RoundTo(c.cfg.Compute()); err != nil {
		return false, "", err
	}
	r, err := runChecked(ctx, linear.Runtime{World: w, Kernels: k}, c.cfg, c.plans, data)
	if err != nil || w.Rank() != 0 {
		return true, "", err
	}
	why := r.verdict(w.Size())
	return why == "", why, nil
}

// parallel runs fs on GOMAXPROCS goroutines and returns when all are done.
func parallel(fs []func()) {
	next := make(chan func())
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(fs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range next {
				f()
			}
		}()
	}
	for _, f := range fs {
		next <- f
	}
	close(next)
	wg.Wait()
}
