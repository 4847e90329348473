package job

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// linearArgs are the flags of `worker linear`.
type linearArgs struct {
	mesh, x, w, b, out, grads, load, dump, model string
	seed                                         uint64
	dev                                          deviceFlags
	// planner, if set, plans instead of --model's (verify's cases share one).
	planner *placement.Planner
}

func (a linearArgs) config() (linear.Config, error) {
	cfg, _, err := a.plan(context.Background())
	return cfg, err
}

// plan parses the flags and plans the layer within ctx: a layout the rules
// refuse is a usage error, reported before any work.
func (a linearArgs) plan(ctx context.Context) (linear.Config, linear.Plans, error) {
	cfg, err := a.parse()
	if err != nil {
		return cfg, linear.Plans{}, err
	}
	p, err := linear.PlanContext(ctx, cfg)
	return cfg, p, err
}

// maxReference bounds the multiply-adds of the float64 reference every rank
// of `worker linear` computes to check its results (M·N·K; 4096³ at most).
const maxReference = 1 << 36

// linearMemory estimates one rank's bytes for a linear run of x[M, K],
// w[N, K]: the whole float32 tensors x, w, b, dy (every process draws
// them), the float64 reference y, dx, dw, db and the magnitudes of their
// terms, and the float32 results gathered to be compared. It refuses sizes
// whose reference would take more than maxReference multiply-adds.
func linearMemory(x []int, n int) (int64, string, error) {
	k := x[len(x)-1]
	m, _ := placement.ShapeElems(x[:len(x)-1]) // x is a valid spec: no overflow
	mk, _ := placement.MulSize(m, int64(k))
	nk, _ := placement.MulSize(int64(n), int64(k))
	mn, ok := placement.MulSize(m, int64(n))
	work, ok2 := placement.MulSize(mn, int64(k))
	if !ok || !ok2 || work > maxReference {
		return 0, "", fmt.Errorf("x %s and w %dx%d: checking the result against the float64 reference takes %s multiply-adds on every rank, more than the %d allowed",
			placement.FormatShape(x), n, k, countString(mn, int64(k)), int64(maxReference))
	}
	elems := mk + nk + mn + int64(n) // each at most MaxElems: no overflow
	data, ref, got := 4*elems, 2*8*elems, 4*elems
	return data + ref + got, fmt.Sprintf("data %s, reference %s, results %s",
		layout.FormatBytes(data), layout.FormatBytes(ref), layout.FormatBytes(got)), nil
}

// countString renders a*b, or "more than 9223372036854775807" when it
// overflows.
func countString(a, b int64) string {
	if p, ok := placement.MulSize(a, b); ok {
		return strconv.FormatInt(p, 10)
	}
	return fmt.Sprintf("more than %d", int64(math.MaxInt64))
}

func (a linearArgs) parse() (linear.Config, error) {
	m, err := placement.ParseMesh(a.mesh)
	if err != nil {
		return linear.Config{}, fmt.Errorf("--mesh: %w", err)
	}
	cfg := linear.Config{Name: "linear"}
	if a.planner != nil {
		cfg.Planner = a.planner
	} else if cfg.Planner, err = readPlanner(a.model); err != nil {
		return cfg, err
	}
	if cfg.X, err = placement.ParseSpec(a.x, m); err != nil {
		return cfg, fmt.Errorf("--x: %w", err)
	}
	if cfg.W, err = placement.ParseSpec(a.w, m); err != nil {
		return cfg, fmt.Errorf("--w: %w", err)
	}
	if a.b != "" {
		b, err := placement.ParseSpec(a.b, m)
		if err != nil {
			return cfg, fmt.Errorf("--b: %w", err)
		}
		cfg.B = &b
	}
	if a.out != "" {
		if cfg.Out, err = placement.ParseList(a.out); err != nil {
			return cfg, fmt.Errorf("--out: %w", err)
		}
	}
	for _, g := range strings.Split(a.grads, ",") {
		switch g {
		case "x":
			cfg.Grads.X = true
		case "w":
			cfg.Grads.W = true
		case "b":
			cfg.Grads.B = true
		case "", "none":
		default:
			return cfg, fmt.Errorf("--grads: %q is not x, w or b", g)
		}
	}
	return cfg, nil
}

// LinearReport is the JSON line `worker linear` prints on rank 0.
type LinearReport struct {
	Mesh        string             `json:"mesh"`
	X           string             `json:"x"`
	W           string             `json:"w"`
	B           string             `json:"b,omitempty"`
	Y           string             `json:"y"`
	DType       string             `json:"dtype"`
	MaxRelErr   float64            `json:"max_rel_err"`
	Tolerance   float64            `json:"tolerance"`
	Errors      map[string]float64 `json:"errors"`
	Collectives []linear.Comm      `json:"collectives"`
	PlanMatch   bool               `json:"plan_match"`
	ForwardMS   float64            `json:"forward_ms"`
	BackwardMS  float64            `json:"backward_ms"`
	Device      string             `json:"device"`
	// Copies between host and device in the forward and backward (rank 0).
	H2DBytes    int64 `json:"h2d_bytes"`
	D2HBytes    int64 `json:"d2h_bytes"`
	StagedBytes int64 `json:"staged_bytes"`
}

// linearTask is `worker linear`.
type linearTask struct {
	a     linearArgs
	cfg   linear.Config
	plans linear.Plans
	rd    rankDevice
	data  *linear.Data // --load's tensors; nil: random ones from --seed
}

func (t *linearTask) flags(fs *flag.FlagSet) {
	a := &t.a
	fs.StringVar(&a.mesh, "mesh", "", "device `MESH`, e.g. tp=4 or dp=2,tp=2 (required)")
	fs.StringVar(&a.x, "x", "", "input x [M,K] as `SHAPE:[PLACEMENTS]`, e.g. 8x16:[S(0)] (required)")
	fs.StringVar(&a.w, "w", "", "weight W [N,K] as `SHAPE:[PLACEMENTS]` (required)")
	fs.StringVar(&a.b, "b", "", "bias b [N] as `SHAPE:[PLACEMENTS]` (default: no bias)")
	fs.StringVar(&a.out, "out", "", "`PLACEMENTS` the consumer wants for y, e.g. [S(0),R] (default: the plan's)")
	fs.StringVar(&a.grads, "grads", "x,w,b", "`GRADS` to compute: some of x,w,b, or none")
	fs.StringVar(&a.load, "load", "", "read x.npy, w.npy, b.npy, dy.npy (float32, whole tensors) from `DIR` (default: random from --seed)")
	fs.StringVar(&a.model, "model", "", modelUsage)
	fs.StringVar(&a.dump, "dump", "", "write y.npy, dx.npy, dw.npy, db.npy (whole tensors) to `DIR` on rank 0")
	fs.Uint64Var(&a.seed, "seed", 1, "seed of the random inputs")
	a.dev.register(fs)
}

func (t *linearTask) setup(ctx context.Context, env Env, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	cfg, plans, err := t.a.plan(ctx)
	if err != nil {
		return err
	}
	if err := cfg.X.Mesh.Validate(worldSize(env, cfg.X.Mesh.Size())); err != nil {
		return err
	}
	if t.rd, err = t.a.dev.resolve(env); err != nil {
		return err
	}
	need, parts, err := linearMemory(cfg.X.Shape, cfg.W.Shape[0])
	if err != nil {
		return err
	}
	if err := checkMemory(env, t.rd.kind, need, parts, ranksHere(env, cfg.X.Mesh.Size())); err != nil {
		return err
	}
	cfg.DType = t.rd.dtype
	if t.a.load != "" {
		if t.data, err = loadData(t.a.load, cfg); err != nil {
			return err
		}
		if err := t.data.RoundTo(cfg.Compute()); err != nil {
			return err
		}
	}
	t.cfg, t.plans = cfg, plans
	return nil
}

func (t *linearTask) run(ctx context.Context, env Env) int {
	a, cfg, plans, rd, data := t.a, t.cfg, t.plans, t.rd, t.data
	if data == nil {
		data = linear.RandomData(cfg.X.Shape, cfg.W.Shape[0], cfg.B != nil, a.seed)
		if err := data.RoundTo(cfg.Compute()); err != nil {
			return usageError(env, "linear", err)
		}
	}
	var mu sync.Mutex
	var report *LinearReport
	err := ranks(ctx, env, cfg.X.Mesh.Size(), func(ctx context.Context, w *collective.World) error {
		dev, err := rd.build()
		if err != nil {
			return err
		}
		c, err := runChecked(ctx, newTracer(env.Run).runtime(w, dev), cfg, plans, data)
		if err != nil {
			return err
		}
		l, res, errs := c.l, c.res, c.errs
		if a.dump != "" {
			if err := dump(ctx, w, l, res, a.dump); err != nil {
				return err
			}
		}
		if w.Rank() != 0 {
			return nil
		}
		r := &LinearReport{Mesh: cfg.X.Mesh.String(), X: cfg.X.String(), W: cfg.W.String(), Y: l.Fwd.Final.Spec.String(),
			Errors: errs, Collectives: res.Executed, ForwardMS: ms(res.Forward), BackwardMS: ms(res.Backward),
			Device: dev.Device().String(), H2DBytes: res.Moved.H2D.Bytes, D2HBytes: res.Moved.D2H.Bytes,
			StagedBytes: res.Moved.StagedH2D.Bytes + res.Moved.StagedD2H.Bytes}
		if cfg.B != nil {
			r.B = cfg.B.String()
		}
		if r.Collectives == nil {
			r.Collectives = []linear.Comm{}
		}
		for _, e := range errs {
			r.MaxRelErr = max(r.MaxRelErr, e)
		}
		r.PlanMatch = c.planMatch()
		r.DType, r.Tolerance = l.Compute().String(), c.tolerance(w.Size())
		mu.Lock()
		report = r
		mu.Unlock()
		return nil
	})
	if err != nil {
		return failure(env, "linear", err)
	}
	if report == nil {
		return 0 // not rank 0
	}
	printJSON(env.Stdout, report)
	if report.MaxRelErr > report.Tolerance || !report.PlanMatch {
		return 1
	}
	return 0
}

// checked is one layer's forward and backward on this rank, checked against the
// float64 reference.
type checked struct {
	l    *linear.Layer
	res  *linear.Result
	errs map[string]float64
}

// tolerance is the largest error that passes (linear.Tolerance for the layer's
// dtype, world and longest contraction).
func (c checked) tolerance(world int) float64 {
	xs, ws := c.l.X.Shape, c.l.Config.W.Shape
	k := max(xs[len(xs)-1], ws[0], tensor.NumElements(xs[:len(xs)-1]))
	return linear.Tolerance(c.l.Compute(), world, k)
}

// runChecked builds rank's layer from plans, runs it on data and checks the
// results (every rank must call it: the check gathers).
func runChecked(ctx context.Context, rt linear.Runtime, cfg linear.Config, plans linear.Plans, data *linear.Data) (checked, error) {
	l, err := linear.NewPlanned(cfg, plans, rt.World.Rank(), rt.Kernels)
	if err != nil {
		return checked{}, err
	}
	res, err := linear.Run(ctx, rt, l, data)
	if err != nil {
		return checked{}, err
	}
	errs, err := linear.Check(ctx, rt.World, l, data, res)
	return checked{l, res, errs}, err
}

// planMatch reports whether this rank ran the collectives the plan promised
// (the plan's bytes are rank 0's).
func (c checked) planMatch() bool { return slices.EqualFunc(c.res.Executed, c.l.Planned(), sameComm) }

// verdict is "" when the run passes on rank 0, else why it fails.
func (c checked) verdict(world int) string {
	names := make([]string, 0, len(c.errs))
	for n := range c.errs {
		names = append(names, n)
	}
	slices.Sort(names)
	tol := c.tolerance(world)
	for _, n := range names {
		if c.errs[n] > tol {
			return fmt.Sprintf("%s: error %.3g over the tolerance %.3g", n, c.errs[n], tol)
		}
	}
	if !c.planMatch() {
		return fmt.Sprintf("collectives %v, plan %v", c.res.Executed, c.l.Planned())
	}
	return ""
}

func sameComm(a, b linear.Comm) bool {
	return a.Kind == b.Kind && a.Tensor == b.Tensor && slices.Equal(a.MeshDims, b.MeshDims) && a.Count == b.Count && a.Bytes == b.Bytes
}

func loadData(dir string, cfg linear.Config) (*linear.Data, error) {
	d := &linear.Data{}
	for _, f := range []struct {
		name  string
		dst   **tensor.Tensor
		shape []int
		opt   bool
	}{
		{"x", &d.X, cfg.X.Shape, false},
		{"w", &d.W, cfg.W.Shape, false},
		{"b", &d.B, nil, cfg.B == nil},
		{"dy", &d.DY, nil, false},
	} {
		if f.opt {
			continue
		}
		t, err := tensor.Load(filepath.Join(dir, f.name+".npy"))
		if err != nil {
			return nil, err
		}
		if t.DType() != tensor.Float32 {
			return nil, fmt.Errorf("%s.npy is %v, want float32", f.name, t.DType())
		}
		if f.shape != nil && !slices.Equal(t.Shape(), f.shape) {
			return nil, fmt.Errorf("%s.npy has shape %v, --%s says %v", f.name, t.Shape(), f.name, f.shape)
		}
		*f.dst = t
	}
	if cfg.B != nil && !slices.Equal(d.B.Shape(), cfg.B.Shape) {
		return nil, fmt.Errorf("b.npy has shape %v, --b says %v", d.B.Shape(), cfg.B.Shape)
	}
	want := append(slices.Clone(cfg.X.Shape[:len(cfg.X.Shape)-1]), cfg.W.Shape[0])
	if !slices.Equal(d.DY.Shape(), want) {
		return nil, fmt.Errorf("dy.npy has shape %v, want %v", d.DY.Shape(), want)
	}
	return d, nil
}

// dump assembles y and the gradients and writes them on rank 0.
func dump(ctx context.Context, w *collective.World, l *linear.Layer, res *linear.Result, dir string) error {
	items := []struct {
		name string
		spec placement.Spec
		t    *tensor.Tensor
	}{{"y", l.Fwd.Final.Spec, res.Y}}
	for _, g := range l.Bwd.Grads {
		t := map[string]*tensor.Tensor{"x": res.DX, "w": res.DW, "b": res.DB}[g.Input]
		items = append(items, struct {
			name string
			spec placement.Spec
			t    *tensor.Tensor
		}{"d" + g.Input, g.Final.Spec, t})
	}
	var errs []error
	for _, it := range items {
		full, err := linear.Gather(ctx, w, it.spec, it.t)
		if err != nil {
			return err
		}
		if w.Rank() == 0 {
			errs = append(errs, full.Save(filepath.Join(dir, it.name+".npy")))
		}
	}
	return errors.Join(errs...)
}
