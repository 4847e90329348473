package job

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/moe"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// moeTask is `worker moe`: the mixture-of-experts layer's forward and
// backward on a mesh of dp, ep and tp, on random tensors (a benchmark of
// --steps steps) or on --load's (one step, its results written by --dump).
type moeTask struct {
	mesh       string
	shape      spmd.MoEShape
	auxCoef    float64
	steps      int
	seed       uint64
	load, dump string
	dev        deviceFlags

	plan *spmd.MoEPlan
	rd   rankDevice
	data *moeData
}

// moeData is a layer's whole inputs.
type moeData struct {
	x, dy *tensor.Tensor
	p     moe.Params
}

// MoEReport is the JSON line `worker moe` prints on rank 0.
type MoEReport struct {
	Mesh     string  `json:"mesh"`
	Tokens   int     `json:"tokens"`
	Hidden   int     `json:"hidden"`
	FFN      int     `json:"ffn"`
	Experts  int     `json:"experts"`
	TopK     int     `json:"top_k"`
	Capacity float64 `json:"capacity_factor"`
	// TokensPerExpert is the slots each expert kept, RoutedPerExpert the
	// ones routed to it (more when the capacity drops some).
	TokensPerExpert []int   `json:"tokens_per_expert"`
	RoutedPerExpert []int   `json:"routed_per_expert"`
	Dropped         int     `json:"dropped"`
	Aux             float64 `json:"aux"`
	// DispatchBytes is what rank 0 sent to other ranks in one forward's
	// token all-to-alls (dispatch and combine).
	DispatchBytes int64      `json:"dispatch_bytes"`
	Steps         int        `json:"steps"`
	StepMS        float64    `json:"step_ms_median"`
	ForwardMS     float64    `json:"forward_ms_median"`
	BackwardMS    float64    `json:"backward_ms_median"`
	PlanMatch     bool       `json:"plan_match"`
	Collectives   []moe.Comm `json:"collectives"`
	Device        string     `json:"device"`
	DType         string     `json:"dtype"`
}

func (t *moeTask) flags(fs *flag.FlagSet) {
	fs.StringVar(&t.mesh, "mesh", "", "device `MESH` of dims dp, ep and tp, e.g. ep=4, ep=2,tp=2 or dp=2,ep=2 (default: ep over every rank)")
	fs.IntVar(&t.shape.T, "tokens", 512, "tokens `T`")
	fs.IntVar(&t.shape.H, "hidden", 256, "hidden size `H`")
	fs.IntVar(&t.shape.F, "ffn", 512, "each expert's FFN size `F`")
	fs.IntVar(&t.shape.E, "experts", 8, "experts `E`")
	fs.IntVar(&t.shape.K, "top-k", 2, "experts per token `K` (1..E)")
	fs.Float64Var(&t.auxCoef, "aux-coef", 0.01, "the load-balancing loss's coefficient in the objective Σ dy⊙y + a·aux")
	fs.Float64Var(&t.shape.Capacity, "capacity-factor", 0, "capacity factor `c`: each expert keeps ceil(T·K·c/E) slots, drops the rest (0: dropless)")
	fs.IntVar(&t.steps, "steps", 10, "forward and backward steps on the same tensors (the report gives their median times)")
	fs.Uint64Var(&t.seed, "seed", 1, "seed of the random tensors")
	fs.StringVar(&t.load, "load", "", "read x, router, w1, b1, w2, b2, dy (.npy, float32, whole) from `DIR` instead: their shapes give T, H, F and E; one step")
	fs.StringVar(&t.dump, "dump", "", "write y, aux, dx, drouter, dw1, db1, dw2, db2 (.npy, float32, whole) to `DIR` on rank 0")
	t.dev.register(fs)
}

// moeFiles are --load's inputs, in order.
var moeFiles = []string{"x", "router", "w1", "b1", "w2", "b2", "dy"}

func (t *moeTask) setup(ctx context.Context, env Env, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	if t.load != "" {
		d, err := loadMoE(t.load)
		if err != nil {
			return err
		}
		t.data = d
		t.shape.T, t.shape.H, t.shape.E, t.shape.F = d.x.Dim(0), d.x.Dim(1), d.p.W1.Dim(0), d.p.W1.Dim(1)
		t.steps = 1
	}
	s := t.shape
	switch {
	case s.E < 1:
		return fmt.Errorf("--experts %d: a layer needs at least 1 expert", s.E)
	case s.K < 1:
		return fmt.Errorf("--top-k %d: each token goes to at least 1 expert", s.K)
	case s.K > s.E:
		return fmt.Errorf("--top-k %d is more than --experts %d", s.K, s.E)
	case s.T < 1 || s.H < 1 || s.F < 1:
		return fmt.Errorf("--tokens %d, --hidden %d, --ffn %d: each at least 1", s.T, s.H, s.F)
	case s.Capacity < 0 || math.IsNaN(s.Capacity) || math.IsInf(s.Capacity, 0):
		return fmt.Errorf("--capacity-factor %v: 0 (dropless) or more", s.Capacity)
	case t.steps < 1:
		return fmt.Errorf("--steps %d: at least 1", t.steps)
	case math.IsNaN(t.auxCoef) || math.IsInf(t.auxCoef, 0):
		return fmt.Errorf("--aux-coef %v is not finite", t.auxCoef)
	}
	spec := t.mesh
	if spec == "" {
		spec = fmt.Sprintf("ep=%d", worldSize(env, 1))
	}
	m, err := placement.ParseMesh(spec)
	if err != nil {
		return fmt.Errorf("--mesh: %w", err)
	}
	if t.plan, err = spmd.PlanMoE(m, s, 4); err != nil {
		return fmt.Errorf("--mesh %s: %w", m, err)
	}
	if err := m.Validate(worldSize(env, m.Size())); err != nil {
		return err
	}
	if t.data != nil {
		if err := checkLogits(t.data); err != nil {
			return err
		}
	}
	if t.rd, err = t.dev.resolve(env); err != nil {
		return err
	}
	if t.rd.dtype != tensor.Float32 {
		return fmt.Errorf("--dtype %v: the mixture-of-experts layer computes in float32", t.rd.dtype)
	}
	return nil
}

// loadMoE reads --load's tensors and checks that their shapes fit one layer.
func loadMoE(dir string) (*moeData, error) {
	ts := map[string]*tensor.Tensor{}
	for _, n := range moeFiles {
		x, err := tensor.Load(filepath.Join(dir, n+".npy"))
		if err != nil {
			return nil, err
		}
		if x.DType() != tensor.Float32 {
			return nil, fmt.Errorf("%s.npy is %v, want float32", n, x.DType())
		}
		ts[n] = x
	}
	x, w1 := ts["x"], ts["w1"]
	if x.Rank() != 2 || w1.Rank() != 3 {
		return nil, fmt.Errorf("x.npy has shape %v and w1.npy %v: want [T H] and [E F H]", x.Shape(), w1.Shape())
	}
	t, h, e, f := x.Dim(0), x.Dim(1), w1.Dim(0), w1.Dim(1)
	for _, want := range []struct {
		name  string
		shape []int
	}{{"router", []int{e, h}}, {"w1", []int{e, f, h}}, {"b1", []int{e, f}}, {"w2", []int{e, h, f}}, {"b2", []int{e, h}}, {"dy", []int{t, h}}} {
		if got := ts[want.name].Shape(); !slices.Equal(got, want.shape) {
			return nil, fmt.Errorf("%s.npy has shape %v, want %v (x.npy is [%d %d], w1.npy [%d %d %d])", want.name, got, want.shape, t, h, e, f, h)
		}
	}
	return &moeData{x: x, dy: ts["dy"], p: moe.Params{Router: ts["router"], W1: w1, B1: ts["b1"], W2: ts["w2"], B2: ts["b2"]}}, nil
}

// checkLogits refuses router logits x·routerᵀ that are not finite, before
// any rank starts.
func checkLogits(d *moeData) error {
	x, r := d.x.Float32(), d.p.Router.Float32()
	h, e := d.x.Dim(1), d.p.Router.Dim(0)
	for t := range d.x.Dim(0) {
		for j := range e {
			var s float64
			for i := range h {
				s += float64(x[t*h+i]) * float64(r[j*h+i])
			}
			if math.IsNaN(s) || math.IsInf(s, 0) {
				return fmt.Errorf("%w: token %d, expert %d: %v (x.npy times router.npy)", moe.ErrLogits, t, j, s)
			}
		}
	}
	return nil
}

// randomMoE draws a layer's inputs from seed: x and dy in [-1, 1), the
// weights scaled by 1/sqrt of their inputs.
func randomMoE(s spmd.MoEShape, seed uint64) *moeData {
	rng := rand.New(rand.NewPCG(seed, 29))
	draw := func(scale float64, shape ...int) *tensor.Tensor {
		t := tensor.New(tensor.Float32, shape...)
		d := t.Float32()
		for i := range d {
			d[i] = float32(scale * (2*rng.Float64() - 1))
		}
		return t
	}
	hs, fs := 1/math.Sqrt(float64(s.H)), 1/math.Sqrt(float64(s.F))
	return &moeData{x: draw(1, s.T, s.H), dy: draw(1, s.T, s.H), p: moe.Params{
		Router: draw(hs, s.E, s.H), W1: draw(hs, s.E, s.F, s.H), B1: draw(hs, s.E, s.F),
		W2: draw(fs, s.E, s.H, s.F), B2: draw(fs, s.E, s.H)}}
}

func (t *moeTask) run(ctx context.Context, env Env) int {
	pl, d := t.plan, t.data
	if d == nil {
		d = randomMoE(pl.Shape, t.seed)
	}
	var mu sync.Mutex
	var report *MoEReport
	err := ranks(ctx, env, pl.Mesh.Size(), func(ctx context.Context, w *collective.World) error {
		dev, err := t.rd.build()
		if err != nil {
			return err
		}
		l, err := moe.New(moe.Config{Plan: pl, AuxCoef: t.auxCoef, DType: tensor.Float32}, w.Rank(), dev, d.p)
		if err != nil {
			return err
		}
		first, n := l.Tokens()
		x, err := uploadRows(dev, d.x, first, n)
		if err != nil {
			return err
		}
		dyl, err := uploadRows(dev, d.dy, first, n)
		if err != nil {
			return err
		}
		var fwd, bwd, steps []float64
		var y, dx *tensor.Tensor
		var st moe.Stats
		for range t.steps {
			t0 := time.Now()
			if y, st, err = l.Forward(ctx, w, x); err != nil {
				return err
			}
			t1 := time.Now()
			if dx, err = l.Backward(ctx, w, dyl); err != nil {
				return err
			}
			fwd, bwd = append(fwd, ms(t1.Sub(t0))), append(bwd, ms(time.Since(t1)))
			steps = append(steps, ms(time.Since(t0)))
		}
		if t.dump != "" {
			if err := dumpMoE(ctx, w, l, t.dump, y, dx, st.Aux); err != nil {
				return err
			}
		}
		if w.Rank() != 0 {
			return nil
		}
		s := pl.Shape
		r := &MoEReport{Mesh: pl.Mesh.String(), Tokens: s.T, Hidden: s.H, FFN: s.F, Experts: s.E, TopK: s.K, Capacity: s.Capacity,
			TokensPerExpert: st.Tokens, RoutedPerExpert: st.Routed, Dropped: st.Dropped, Aux: st.Aux, DispatchBytes: st.DispatchBytes,
			Steps: t.steps, StepMS: median(steps), ForwardMS: median(fwd), BackwardMS: median(bwd),
			PlanMatch: l.PlanMatch(), Collectives: slices.Clone(l.Executed), Device: dev.Device().String(), DType: "float32"}
		if r.Collectives == nil {
			r.Collectives = []moe.Comm{}
		}
		mu.Lock()
		report = r
		mu.Unlock()
		return nil
	})
	if err != nil {
		if errors.Is(err, moe.ErrLogits) {
			return usageError(env, "moe", err)
		}
		return failure(env, "moe", err)
	}
	if report == nil {
		return 0
	}
	printJSON(env.Stdout, report)
	if !report.PlanMatch {
		return 1
	}
	return 0
}

// uploadRows puts rows [first, first+n) of whole on the rank's device.
func uploadRows(m tensor.Memory, whole *tensor.Tensor, first, n int) (*tensor.Tensor, error) {
	h := whole.Dim(1)
	r, err := tensor.FromFloat32(whole.Float32()[first*h:(first+n)*h], n, h)
	if err != nil {
		return nil, err
	}
	return tensor.Upload(m, r)
}

// dumpMoE gathers the outputs and gradients at their global shapes and
// writes them on rank 0.
func dumpMoE(ctx context.Context, w *collective.World, l *moe.Layer, dir string, y, dx *tensor.Tensor, aux float64) error {
	pl := l.Plan
	var errs []error
	for _, o := range []struct {
		name  string
		spec  placement.Spec
		local *tensor.Tensor
	}{{"y", pl.X, y}, {"dx", pl.X, dx}, {"drouter", pl.Router, l.DRouter}, {"dw1", pl.W1, l.DW1},
		{"db1", pl.B1, l.DB1}, {"dw2", pl.W2, l.DW2}, {"db2", pl.B2, l.DB2}} {
		full, err := moe.Gather(ctx, w, o.spec, o.local)
		if err != nil {
			return err
		}
		if w.Rank() == 0 {
			errs = append(errs, full.Save(filepath.Join(dir, o.name+".npy")))
		}
	}
	if w.Rank() == 0 {
		a := tensor.New(tensor.Float32)
		a.Float32()[0] = float32(aux)
		errs = append(errs, a.Save(filepath.Join(dir, "aux.npy")))
	}
	return errors.Join(errs...)
}
