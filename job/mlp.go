package job

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/redistribute"
	"github.com/meshrun/meshrun/runlog"
	"github.com/meshrun/meshrun/tensor"
)

// MLPReport is the JSON line `worker mlp` prints on rank 0 at the end.
type MLPReport struct {
	Mesh             string `json:"mesh"`
	Device           string `json:"device"`
	Kernels          string `json:"kernels"`
	DType            string `json:"dtype"`
	SequenceParallel bool   `json:"sequence_parallel"`
	Tokens           int    `json:"tokens"`
	Hidden           int    `json:"hidden"`
	FFN              int    `json:"ffn"`
	Steps            int    `json:"steps"`
	FirstStep        int    `json:"first_step"` // 1, or the checkpoint's step + 1
	// LoadMS is the time --resume/--init took to read and place the
	// parameters, SaveMS the last checkpoint's save; ParamBytes their size.
	// SaveFailures counts the saves that failed and were skipped
	// (--save-errors continue).
	LoadMS           float64        `json:"load_ms,omitempty"`
	SaveMS           float64        `json:"save_ms,omitempty"`
	SaveFailures     int            `json:"save_failures,omitempty"`
	ParamBytes       int64          `json:"param_bytes"`
	LossFirst        float64        `json:"loss_first"`
	LossLast         float64        `json:"loss_last"`
	StepMSMedian     float64        `json:"step_ms_median"`
	GFLOPs           float64        `json:"gflops"`
	CommBytesPerStep int64          `json:"comm_bytes_per_step"`
	Collectives      map[string]int `json:"collectives_per_step"`
	// The median step's time in local kernels and in redistributions, and
	// the rest (the runtime's overhead): they add up to StepMSMedian.
	KernelMS   float64 `json:"kernel_ms"`
	CommMS     float64 `json:"comm_ms"`
	OverheadMS float64 `json:"overhead_ms"`
	// Per step (the last): copies between host and device memory the step made
	// (the loss; nothing else), and the bytes a staged collective backend moved
	// through host memory.
	H2DBytesPerStep    int64 `json:"h2d_bytes_per_step"`
	D2HBytesPerStep    int64 `json:"d2h_bytes_per_step"`
	H2DCopiesPerStep   int64 `json:"h2d_copies_per_step"`
	D2HCopiesPerStep   int64 `json:"d2h_copies_per_step"`
	StagedBytesPerStep int64 `json:"staged_bytes_per_step"`
}

// mlpTask is `worker mlp`.
type mlpTask struct {
	training
	cfg       models.MLPConfig
	lr        float64
	gradDType string
	model     string
}

func (t *mlpTask) flags(fs *flag.FlagSet) {
	t.register(fs, "device `MESH`, its last dim tensor parallel, e.g. dp=2,tp=2 (default tp=$WORLD_SIZE)")
	fs.BoolVar(&t.cfg.SequenceParallel, "sequence-parallel", false, "split tokens over tp outside the block")
	fs.IntVar(&t.cfg.Tokens, "tokens", 512, "tokens per step")
	fs.IntVar(&t.cfg.Hidden, "hidden", 1024, "hidden size")
	fs.IntVar(&t.cfg.FFN, "ffn", 0, "ffn size (default 4 x hidden)")
	fs.IntVar(&t.steps, "steps", 20, "training steps")
	fs.Uint64Var(&t.cfg.Seed, "seed", 1, "seed of parameters and data")
	fs.Float64Var(&t.lr, "lr", 0.05, "SGD learning rate")
	fs.StringVar(&t.gradDType, "grad-dtype", "", "`DTYPE` weight gradients are reduced in: float32 or bfloat16 (default: --dtype)")
	fs.StringVar(&t.model, "model", "", modelUsage)
}

func (t *mlpTask) setup(ctx context.Context, env Env, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	cfg := &t.cfg
	if err := t.prepare(env); err != nil {
		return err
	}
	m := t.m
	if _, err := m.DimIndex("cp"); err == nil {
		return fmt.Errorf("--mesh %s: the MLP block has no sequence dim to split over cp (context parallelism is attention's: gpt, attention)", m)
	}
	if cfg.FFN == 0 && cfg.Hidden > 0 {
		ffn, ok := placement.MulSize(4, int64(cfg.Hidden))
		if !ok || ffn > placement.MaxElems {
			return fmt.Errorf("--hidden %d: the default --ffn, 4 x --hidden, is too large", cfg.Hidden)
		}
		cfg.FFN = int(ffn)
	}
	if t.steps < 1 || cfg.Tokens < 1 || cfg.Hidden < 1 || cfg.FFN < 1 {
		return fmt.Errorf("--steps, --tokens, --hidden and --ffn must be positive")
	}
	cfg.DType = t.rd.dtype
	var err error
	if t.gradDType != "" {
		if cfg.GradDType, err = tensor.ParseDType(t.gradDType); err != nil || (cfg.GradDType != tensor.Float32 && cfg.GradDType != tensor.BFloat16) {
			return fmt.Errorf("--grad-dtype %q: want float32 or bfloat16", t.gradDType)
		}
	}
	cfg.Mesh, cfg.LR = m, float32(t.lr)
	if cfg.Planner, err = readPlanner(t.model); err != nil {
		return err
	}
	params, mem, err := models.CheckMLP(ctx, *cfg)
	if err != nil {
		return err
	}
	if err := checkMemory(env, t.rd.kind, mem.Total(), mem.Parts(), ranksHere(env, m.Size())); err != nil {
		return err
	}
	return t.resume(env, params)
}

func (t *mlpTask) run(ctx context.Context, env Env) int {
	if t.profile != "" {
		stop, err := startProfile(env, t.profile)
		if err != nil {
			return usageError(env, "mlp", err)
		}
		defer stop()
	}
	cfg, m, ck, startStep, rd, cf, steps := t.cfg, t.m, t.ck, t.startStep, t.rd, t.cf, t.steps
	var report *MLPReport
	var mu sync.Mutex
	err := ranks(ctx, env, m.Size(), func(ctx context.Context, w *collective.World) error {
		dev, err := rd.build()
		if err != nil {
			return err
		}
		block, err := models.NewMLP(cfg, w.Rank(), dev)
		if err != nil {
			return err
		}
		var loadMS float64
		sv := saves{cf: cf, env: env, workload: "mlp"}
		if ck != nil {
			// Time the load from when every rank is ready (not from when the
			// first finished initializing).
			if err := waitAll(ctx, w); err != nil {
				return err
			}
			if t.autoResumed && w.Rank() == 0 {
				fmt.Fprintf(env.Stderr, "mlp: restart %s: resuming from %s at step %d\n", env.Getenv(EnvRestartCount), ck.Dir, startStep)
			}
			start := time.Now()
			if err := linear.LoadParams(ctx, w, ck, block.Params()); err != nil {
				return err
			}
			loadMS = ms(time.Since(start))
		}
		comms := stepComms{counts: map[string]int{}}
		tr := newTracer(env.Run)
		rt := tr.runtime(w, dev)
		rt.Record = comms.record
		var recs []runlog.StepRecord
		var first, last float64
		var moved tensor.Transfers
		var profiled time.Duration // the steps after the first, with --op-profile
		if t.opProfile && w.Rank() == 0 {
			defer func() { tr.profileTable(env.Stderr, "", steps-startStep-1, profiled) }()
		}
		for s := startStep + 1; s <= steps; s++ {
			tr.take("kernel")
			tr.take("collective")
			comms.reset()
			before := dev.Transfers()
			start := time.Now()
			loss, err := block.Step(ctx, rt)
			if err != nil {
				return err
			}
			d := time.Since(start)
			moved = dev.Transfers().Sub(before)
			rec := comms.stepRecord(s, loss, d, tr.take("kernel"), tr.take("collective"))
			env.Run.Step(rec)
			recs = append(recs, rec)
			if s == startStep+1 {
				first = loss
				if t.opProfile {
					tr.profile() // from the second step: the first loads modules and picks algorithms
				}
			} else {
				profiled += d
			}
			last = loss
			if w.Rank() == 0 {
				env.Run.Progress(s, steps, loss, d)
				fmt.Fprintf(env.Stdout, "step %d/%d loss %.6f time %.2f ms\n", s, steps, loss, ms(d))
			}
			if err := sv.step(ctx, w, block.Params(), s, steps); err != nil {
				return err
			}
		}
		if w.Rank() != 0 {
			return nil
		}
		r := &MLPReport{Mesh: m.String(), Device: dev.Device().String(), Kernels: rd.choice.String(), DType: rd.dtype.String(),
			SequenceParallel: cfg.SequenceParallel, Tokens: cfg.Tokens, Hidden: cfg.Hidden,
			FFN: cfg.FFN, Steps: steps, FirstStep: startStep + 1, LossFirst: first, LossLast: last,
			LoadMS: loadMS, SaveMS: sv.MS, SaveFailures: sv.Failed, ParamBytes: paramBytes(block.Params()),
			CommBytesPerStep: comms.bytes, Collectives: maps.Clone(comms.counts)}
		// The median step (median's) and its own breakdown, which adds up
		// to it.
		if len(recs) > 0 {
			m := slices.SortedFunc(slices.Values(recs), func(a, b runlog.StepRecord) int { return cmp.Compare(a.StepMS, b.StepMS) })[len(recs)/2]
			r.StepMSMedian, r.KernelMS, r.CommMS, r.OverheadMS = m.StepMS, m.KernelMS, m.CollectiveMS, m.OtherMS
		}
		r.GFLOPs = cfg.FLOPsPerStep() / (r.StepMSMedian / 1e3) / 1e9
		r.H2DBytesPerStep, r.D2HBytesPerStep = moved.H2D.Bytes, moved.D2H.Bytes
		r.H2DCopiesPerStep, r.D2HCopiesPerStep = moved.H2D.Calls, moved.D2H.Calls
		r.StagedBytesPerStep = moved.StagedH2D.Bytes + moved.StagedD2H.Bytes
		mu.Lock()
		report = r
		mu.Unlock()
		return nil
	})
	return finish(env, "mlp", err, report)
}

// finish ends a training workload: its error (a checkpoint that could not
// be loaded is bad input), or rank 0's report as one JSON line.
func finish[R any](env Env, name string, err error, report *R) int {
	if err != nil {
		if corrupt(err) {
			return usageError(env, name, err)
		}
		return failure(env, name, err)
	}
	if report != nil {
		printJSON(env.Stdout, report)
	}
	return 0
}

// stepComms counts a rank's collectives of one step that move bytes, by
// "kind tensor", and the bytes it passes into them.
type stepComms struct {
	bytes  int64
	counts map[string]int
	kinds  map[string]int64 // bytes by collective kind
}

func (c *stepComms) record(name string, ex redistribute.Executed) {
	if len(ex.Group) > 1 && ex.Kind.Moves() {
		c.bytes += ex.Bytes
		c.counts[ex.Kind.String()+" "+name]++
		if c.kinds == nil {
			c.kinds = map[string]int64{}
		}
		c.kinds[ex.Kind.String()] += ex.Bytes
	}
}

func (c *stepComms) reset() {
	c.bytes = 0
	clear(c.counts)
	clear(c.kinds)
}

// stepRecord is a step's record for steps.jsonl, its collectives' bytes
// by kind among it.
func (c *stepComms) stepRecord(step int, loss float64, d, kernel, coll time.Duration) runlog.StepRecord {
	rec := runlog.NewStepRecord(step, loss, d, kernel, coll, c.bytes)
	if len(c.kinds) > 0 {
		rec.CollectiveBytes = maps.Clone(c.kinds)
	}
	return rec
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}
