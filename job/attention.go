package job

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/redistribute"
	"github.com/meshrun/meshrun/ring"
	"github.com/meshrun/meshrun/tensor"
)

// attentionTask is `worker attention`: causal (or full) attention with the
// sequence split over a cp mesh dim, run as ring attention, timed.
type attentionTask struct {
	mesh                 string
	seq, heads, dim, bat int
	full                 bool
	layout               string
	steps                int
	seed                 uint64
	dev                  deviceFlags

	m  placement.Mesh
	cp int // the cp dim (-1: none)
	l  ring.Layout
	rd rankDevice
}

// AttentionReport is the JSON line `worker attention` prints on rank 0.
type AttentionReport struct {
	Mesh       string  `json:"mesh"`
	Seq        int     `json:"seq"`
	Heads      int     `json:"heads"`
	Dim        int     `json:"dim"`
	Batch      int     `json:"batch"`
	Causal     bool    `json:"causal"`
	Layout     string  `json:"layout"`
	Steps      int     `json:"steps"`
	StepMS     float64 `json:"step_ms_median"`
	ForwardMS  float64 `json:"forward_ms_median"`
	BackwardMS float64 `json:"backward_ms_median"`
	// SentBytes is what rank 0 sent in one forward and backward; KVBytes
	// the most keys and values (and their gradients) its ring held at once;
	// HeapPeakBytes the most heap the step used above what was live before
	// it (sampled every millisecond).
	SentBytes     int64 `json:"sent_bytes"`
	KVBytes       int64 `json:"kv_peak_bytes"`
	HeapPeakBytes int64 `json:"heap_peak_bytes"`
}

func (t *attentionTask) flags(fs *flag.FlagSet) {
	fs.StringVar(&t.mesh, "mesh", "", "device `MESH` with a cp dim (the sequence's split), e.g. cp=2 (default: cp over every rank)")
	fs.IntVar(&t.seq, "seq", 4096, "sequence length `S`")
	fs.IntVar(&t.heads, "heads", 4, "attention heads")
	fs.IntVar(&t.dim, "dim", 64, "head dim")
	fs.IntVar(&t.bat, "batch", 1, "sequences")
	fs.BoolVar(&t.full, "full", false, "attention without the causal mask")
	fs.StringVar(&t.layout, "layout", "zigzag", "`LAYOUT` of the sequence over cp: zigzag (chunks i and 2cp-1-i of 2cp) or contiguous")
	fs.IntVar(&t.steps, "steps", 3, "forward and backward steps (the report gives their medians)")
	fs.Uint64Var(&t.seed, "seed", 1, "seed of the random tensors")
	t.dev.register(fs)
}

func (t *attentionTask) setup(_ context.Context, env Env, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	var err error
	if t.l, err = ring.ParseLayout(t.layout); err != nil {
		return fmt.Errorf("--layout: %w", err)
	}
	spec := t.mesh
	if spec == "" {
		spec = fmt.Sprintf("cp=%d", worldSize(env, 1))
	}
	if t.m, err = placement.ParseMesh(spec); err != nil {
		return fmt.Errorf("--mesh: %w", err)
	}
	if t.cp, err = t.m.DimIndex("cp"); err != nil || t.m.NDim() != 1 {
		return fmt.Errorf("--mesh %s: one dim named cp (the sequence's split)", t.m)
	}
	if err := t.m.Validate(worldSize(env, t.m.Size())); err != nil {
		return err
	}
	switch {
	case t.seq < 1 || t.heads < 1 || t.dim < 1 || t.bat < 1:
		return fmt.Errorf("--seq %d, --heads %d, --dim %d, --batch %d: each at least 1", t.seq, t.heads, t.dim, t.bat)
	case t.steps < 1:
		return fmt.Errorf("--steps %d: at least 1", t.steps)
	}
	if _, err := ring.Chunks(t.seq, t.m.Size(), t.l); err != nil {
		return fmt.Errorf("--seq %d: %w", t.seq, err)
	}
	if t.rd, err = t.dev.resolve(env); err != nil {
		return err
	}
	if t.rd.kind != tensor.CPU || t.rd.dtype != tensor.Float32 {
		return fmt.Errorf("--device %v --dtype %v: ring attention runs on cpu tensors in float32", t.rd.kind, t.rd.dtype)
	}
	return nil
}

func (t *attentionTask) run(ctx context.Context, env Env) int {
	var mu sync.Mutex
	var report *AttentionReport
	err := ranks(ctx, env, t.m.Size(), func(ctx context.Context, w *collective.World) error {
		k, err := t.rd.build()
		if err != nil {
			return err
		}
		g, err := redistribute.MeshGroup(ctx, w, t.m, t.cp)
		if err != nil {
			return err
		}
		a, err := ring.New(ring.Config{Group: g, Kernels: k, Causal: !t.full, Layout: t.l, S: t.seq, B: t.bat, H: t.heads, E: t.dim, F: t.dim,
			Rank: g.Index(), Size: g.Size()})
		if err != nil {
			return err
		}
		rows := ring.Len(a.Local())
		rng := rand.New(rand.NewPCG(t.seed, uint64(w.Rank())))
		draw := func() *tensor.Tensor {
			x := tensor.New(tensor.Float32, t.bat, rows, t.heads, t.dim)
			for i := range x.Float32() {
				x.Float32()[i] = float32(2*rng.Float64() - 1)
			}
			return x
		}
		q, kk, v, do := draw(), draw(), draw(), draw()
		var fwd, bwd, steps []float64
		var heap int64
		for range t.steps {
			peak := heapPeak()
			t0 := time.Now()
			if _, _, err := a.Forward(ctx, q, kk, v); err != nil {
				return err
			}
			t1 := time.Now()
			if _, _, _, err := a.Backward(ctx, do); err != nil {
				return err
			}
			fwd, bwd = append(fwd, ms(t1.Sub(t0))), append(bwd, ms(time.Since(t1)))
			steps = append(steps, ms(time.Since(t0)))
			heap = max(heap, peak())
		}
		if w.Rank() != 0 {
			return nil
		}
		mu.Lock()
		report = &AttentionReport{Mesh: t.m.String(), Seq: t.seq, Heads: t.heads, Dim: t.dim, Batch: t.bat, Causal: !t.full, Layout: t.l.String(),
			Steps: t.steps, StepMS: median(steps), ForwardMS: median(fwd), BackwardMS: median(bwd),
			SentBytes: a.Sent(), KVBytes: a.PeakKV(), HeapPeakBytes: heap}
		mu.Unlock()
		return nil
	})
	if err != nil {
		return failure(env, "attention", err)
	}
	if report != nil {
		printJSON(env.Stdout, report)
	}
	return 0
}

// heapPeak samples the heap in use every millisecond until the function it
// returns is called, which gives the most seen above the heap in use when
// it started. A GC first makes the start a floor of what is live.
func heapPeak() func() int64 {
	runtime.GC()
	var st runtime.MemStats
	runtime.ReadMemStats(&st)
	base := int64(st.HeapInuse)
	var peak atomic.Int64
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			var s runtime.MemStats
			runtime.ReadMemStats(&s)
			if d := int64(s.HeapInuse) - base; d > peak.Load() {
				peak.Store(d)
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return func() int64 {
		close(done)
		<-stopped
		return peak.Load()
	}
}
