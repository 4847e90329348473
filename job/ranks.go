package job

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/protocol"
	"github.com/meshrun/meshrun/runlog"
)

// ranks runs fn on this process's rank of a launched job (joined over NATS), or,
// when the process was not launched (no MESHRUN_NATS_URL), on n ranks in this
// process: `worker linear --mesh tp=4 ...` works alone.
func ranks(ctx context.Context, env Env, n int, fn func(ctx context.Context, w *collective.World) error) error {
	if env.Getenv("MESHRUN_NATS_URL") == "" {
		return inProcess(ctx, env.Getenv, n, fn)
	}
	cfg := bootstrap.EnvConfig()
	cfg.Logger = env.Run.Log
	cfg.Backends = collectiveBackends(env.Getenv)
	w, err := bootstrap.Join(ctx, cfg)
	if err != nil {
		return err
	}
	defer w.Close()
	if err := fn(ctx, w); err != nil {
		w.Fail(blaming(w, err))
		return err
	}
	return nil
}

// blaming is the failure a rank publishes to its peers for err: err naming
// the rank it blames, when it blames another (a checkpoint save that failed
// on other ranks: they are the root cause, not this rank), so that the
// launcher's evidence names them; else err, which blames this rank.
func blaming(w *collective.World, err error) error {
	var ce *collective.Error
	if c := protocol.Culprit(err); c >= 0 && c != w.Rank() && !errors.As(err, &ce) {
		return &collective.Error{Kind: collective.ErrAborted, Rank: c, Reporter: w.Rank(), Detail: err.Error()}
	}
	return err
}

// worldSize is the job's world size, or def when the process was not launched.
func worldSize(env Env, def int) int {
	if n, err := strconv.Atoi(env.Getenv("WORLD_SIZE")); err == nil && n > 0 {
		return n
	}
	return def
}

// workloadMesh parses a workload's --mesh (default tp=$WORLD_SIZE) and
// checks it against the world.
func workloadMesh(env Env, s string) (placement.Mesh, error) {
	if s == "" {
		s = "tp=" + strconv.Itoa(worldSize(env, 1))
	}
	m, err := placement.ParseMesh(s)
	if err != nil {
		return placement.Mesh{}, fmt.Errorf("--mesh: %w", err)
	}
	return m, m.Validate(worldSize(env, m.Size()))
}

// newFlags returns a flag set that reports errors instead of printing them.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// usageError prints one line and returns ExitUsage.
func usageError(env Env, workload string, err error) int {
	fmt.Fprintf(env.Stderr, "worker %s: %v\n", workload, err)
	return ExitUsage
}

// failure records the error (error.json, with the culprit rank), prints one line
// and returns 1.
func failure(env Env, workload string, err error) int {
	env.Run.Fail(err)
	fmt.Fprintf(env.Stderr, "worker %s: %v\n", workload, err)
	return 1
}

// tracer opens a trace span per kernel and redistribution (trace.json) and sums
// their time per category ("kernel", "collective").
type tracer struct {
	run   *runlog.Rank
	mu    sync.Mutex
	total map[string]time.Duration
	ops   map[opKey]*opTime // per kernel and collective, while profiling (--op-profile)
}

// opKey names a span: its category and name.
type opKey struct{ cat, name string }

// opTime is a span's calls and time.
type opTime struct {
	calls int
	d     time.Duration
}

func newTracer(run *runlog.Rank) *tracer { return &tracer{run: run, total: map[string]time.Duration{}} }

func (t *tracer) trace(name, cat string) func() {
	sp := t.run.Span(name, cat)
	start := time.Now()
	return func() {
		d := time.Since(start)
		sp.End()
		t.mu.Lock()
		t.total[cat] += d
		if t.ops != nil && (cat == "kernel" || cat == "collective") {
			o := t.ops[opKey{cat, name}]
			if o == nil {
				o = &opTime{}
				t.ops[opKey{cat, name}] = o
			}
			o.calls++
			o.d += d
		}
		t.mu.Unlock()
	}
}

// take returns and resets the time spent in a category.
func (t *tracer) take(cat string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.total[cat]
	delete(t.total, cat)
	return d
}

// profile starts (or restarts) counting each kernel's and collective's calls
// and time.
func (t *tracer) profile() {
	t.mu.Lock()
	t.ops = map[opKey]*opTime{}
	t.mu.Unlock()
}

// profileTable writes the kernels and collectives counted since profile, per
// step of the steps that took wall in all, slowest first, and the rest of the
// step (host work, launches, copies) as "other". On a GPU, time the kernels
// with MESHRUN_CUDA_SYNC=1: otherwise a span ends when its launch returns.
// of names what was profiled ("" for the rank; "stage 1" under pp).
func (t *tracer) profileTable(w io.Writer, of string, steps int, wall time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if steps < 1 || t.ops == nil {
		return
	}
	keys := slices.Collect(maps.Keys(t.ops))
	slices.SortFunc(keys, func(a, b opKey) int { return cmp.Or(cmp.Compare(t.ops[b].d, t.ops[a].d), cmp.Compare(a.name, b.name)) })
	per := func(d time.Duration) float64 { return ms(d) / float64(steps) }
	if of != "" {
		of = " of " + of
	}
	// One write: under pp each stage's first rank prints its table at the
	// same time, on the same stream in a test or a log.
	out := w
	var b strings.Builder
	w = &b
	defer func() { io.WriteString(out, b.String()) }()
	fmt.Fprintf(w, "op profile%s: %d steps, %.3f ms a step\n", of, steps, per(wall))
	fmt.Fprintf(w, "%-24s %-10s %9s %10s %6s\n", "op", "kind", "calls", "ms/step", "%")
	var sum time.Duration
	for _, k := range keys {
		o := t.ops[k]
		sum += o.d
		fmt.Fprintf(w, "%-24s %-10s %9.1f %10.3f %6.1f\n", k.name, k.cat, float64(o.calls)/float64(steps), per(o.d), 100*float64(o.d)/float64(wall))
	}
	fmt.Fprintf(w, "%-24s %-10s %9s %10.3f %6.1f\n", "other", "host", "", per(wall-sum), 100*float64(wall-sum)/float64(wall))
}

// runtime is the linear runtime of a workload: kernels and moves traced.
func (t *tracer) runtime(w *collective.World, k kernels.Compute) linear.Runtime {
	return linear.Runtime{World: w, Kernels: linear.Traced(k, t.trace), Trace: t.trace}
}

// startProfile starts a CPU profile written to path, "%r" in it replaced
// by the process's rank ($RANK, set by the launcher; "all" for in-process
// ranks, which share the one profile); stop ends it.
func startProfile(env Env, path string) (stop func(), err error) {
	rank := "all"
	if env.Getenv("MESHRUN_NATS_URL") != "" {
		rank = env.Getenv("RANK")
	}
	f, err := os.Create(strings.ReplaceAll(path, "%r", rank))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

func printJSON(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "%s\n", b)
}
