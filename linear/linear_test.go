package linear_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/job"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/redistribute"
)

type layerCase struct {
	mesh    string
	x, w, b string
	out     string
	grads   linear.Grads
}

func spec(t testing.TB, s string, m placement.Mesh) placement.Spec {
	sp, err := placement.ParseSpec(s, m)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

func runCase(t *testing.T, c layerCase) {
	m, err := placement.ParseMesh(c.mesh)
	if err != nil {
		t.Fatal(err)
	}
	k, err := providers.New("cpu", nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := linear.Config{Name: "fc", X: spec(t, c.x, m), W: spec(t, c.w, m), Grads: c.grads}
	if c.b != "" {
		b := spec(t, c.b, m)
		cfg.B = &b
	}
	if c.out != "" {
		if cfg.Out, err = placement.ParseList(c.out); err != nil {
			t.Fatal(err)
		}
	}
	data := linear.RandomData(cfg.X.Shape, cfg.W.Shape[0], cfg.B != nil, 7)
	var mu sync.Mutex
	err = job.InProcess(context.Background(), m.Size(), func(ctx context.Context, w *collective.World) error {
		l, err := linear.New(cfg, w.Rank(), nil)
		if err != nil {
			return err
		}
		res, err := linear.Run(ctx, linear.Runtime{World: w, Kernels: k}, l, data)
		if err != nil {
			return err
		}
		errs, err := linear.Check(ctx, w, l, data, res)
		if err != nil {
			return err
		}
		if w.Rank() != 0 {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		for name, e := range errs {
			if e > 1e-5 {
				t.Errorf("%s: relative error %.3g", name, e)
			}
		}
		if want := l.Planned(); !slices.EqualFunc(res.Executed, want, func(a, b linear.Comm) bool {
			return a.Kind == b.Kind && a.Tensor == b.Tensor && slices.Equal(a.MeshDims, b.MeshDims) && a.Count == b.Count && a.Bytes == b.Bytes
		}) {
			t.Errorf("executed %v, planned %v", res.Executed, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestLayouts(t *testing.T) {
	for name, c := range map[string]layerCase{
		"replicated":            {mesh: "tp=2", x: "6x8:[R]", w: "10x8:[R]", b: "10:[R]", grads: linear.AllGrads},
		"column":                {mesh: "tp=3", x: "6x8:[R]", w: "10x8:[S(0)]", b: "10:[S(0)]", grads: linear.AllGrads},
		"column gathered":       {mesh: "tp=4", x: "6x8:[R]", w: "10x8:[S(0)]", b: "10:[S(0)]", out: "[R]", grads: linear.AllGrads},
		"row":                   {mesh: "tp=3", x: "6x8:[S(1)]", w: "10x8:[S(1)]", b: "10:[R]", grads: linear.AllGrads},
		"row sequence parallel": {mesh: "tp=4", x: "7x9:[S(1)]", w: "5x9:[S(1)]", b: "5:[R]", out: "[S(0)]", grads: linear.AllGrads},
		"data parallel":         {mesh: "dp=4", x: "64x8:[S(0)]", w: "10x8:[R]", b: "10:[R]", grads: linear.AllGrads},
		"sequence column":       {mesh: "tp=2", x: "5x8:[S(0)]", w: "12x8:[S(0)]", b: "12:[S(0)]", grads: linear.AllGrads},
		"dp x tp":               {mesh: "dp=2,tp=2", x: "64x8:[S(0),R]", w: "12x8:[R,S(0)]", b: "12:[R,S(0)]", grads: linear.AllGrads},
		"3-D x, uneven":         {mesh: "tp=3", x: "2x5x7:[S(1)]", w: "4x7:[S(0)]", b: "4:[S(0)]", grads: linear.AllGrads},
		"M=1 gemv":              {mesh: "tp=2", x: "1x16:[R]", w: "9x16:[S(0)]", b: "9:[S(0)]", grads: linear.AllGrads},
		"empty shard":           {mesh: "tp=4", x: "3x4:[R]", w: "3x4:[S(0)]", b: "3:[S(0)]", grads: linear.AllGrads},
		"no bias, weights only": {mesh: "tp=2", x: "4x6:[R]", w: "8x6:[S(0)]", grads: linear.Grads{W: true}},
		"partial input":         {mesh: "tp=2", x: "4x6:[P]", w: "8x6:[R]", b: "8:[R]", grads: linear.AllGrads},
	} {
		t.Run(name, func(t *testing.T) { runCase(t, c) })
	}
}

// TestSkippedGradSkipsWork: without dx the layer runs neither the input-gradient
// GEMM nor its all-reduce, and saves no W; without dW it saves no x.
func TestSkippedGradSkipsWork(t *testing.T) {
	m := placement.MustMesh([]int{2}, nil)
	k, err := providers.New("cpu", nil)
	if err != nil {
		t.Fatal(err)
	}
	b := spec(t, "8:[S(0)]", m)
	data := linear.RandomData([]int{4, 6}, 8, true, 3)
	run := func(g linear.Grads) (ops map[string]int, comms int, saved [2]bool) {
		ops = map[string]int{}
		var mu sync.Mutex
		err := job.InProcess(context.Background(), 2, func(ctx context.Context, w *collective.World) error {
			l, err := linear.New(linear.Config{X: spec(t, "4x6:[R]", m), W: spec(t, "8x6:[S(0)]", m), B: &b, Grads: g}, w.Rank(), nil)
			if err != nil {
				return err
			}
			rt := linear.Runtime{World: w, Kernels: k,
				Trace: func(op, cat string) func() {
					if cat == "op" {
						mu.Lock()
						ops[op]++
						mu.Unlock()
					}
					return func() {}
				},
				Record: func(_ string, ex redistribute.Executed) {
					if ex.Kind.Moves() && len(ex.Group) > 1 {
						mu.Lock()
						comms++
						mu.Unlock()
					}
				}}
			x, _ := linear.Shard(data.X, l.X, w.Rank())
			dy, _ := linear.Shard(data.DY, l.Bwd.DY.Spec, w.Rank())
			_, s, err := l.Forward(ctx, rt, x)
			if err != nil {
				return err
			}
			mu.Lock()
			saved = [2]bool{s.X != nil, s.W != nil}
			mu.Unlock()
			if _, err := l.Backward(ctx, rt, dy, s); err != nil {
				return err
			}
			_, _, err = l.Reduce(ctx, rt)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return ops, comms, saved
	}
	ops, comms, saved := run(linear.AllGrads)
	if ops["linear_backward_input"] != 2 || comms != 2 || saved != [2]bool{true, true} {
		t.Fatalf("all grads: ops %v, %d collectives (want the dx all-reduce on both ranks), saved %v", ops, comms, saved)
	}
	ops, comms, saved = run(linear.Grads{W: true, B: true})
	if ops["linear_backward_input"] != 0 || comms != 0 || ops["linear_backward_weight"] != 2 || saved != [2]bool{true, false} {
		t.Fatalf("without dx: ops %v, %d collectives, saved %v", ops, comms, saved)
	}
	ops, _, saved = run(linear.Grads{X: true})
	if ops["linear_backward_weight"] != 0 || ops["linear_backward_bias"] != 0 || saved != [2]bool{false, true} {
		t.Fatalf("only dx: ops %v, saved %v", ops, saved)
	}
}
