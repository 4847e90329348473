package job

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/placement"
)

// calibrateTask is `worker calibrate`: it measures the figures of the
// planners' cost model (placement.Model) on the job's own transport and
// ranks, and writes them where `launcher plan --model` reads them.
//
//   - gamma and alpha, from the median time of a 4-byte all-gather over
//     groups of 2 ranks and over the whole world (t = gamma + (p-1)·alpha);
//     with 2 ranks only, the two cannot be told apart and the time is split
//     evenly;
//   - beta, from the median time of a large all-gather over the world:
//     t = gamma + (p-1)·alpha + (p-1)/p·bytes/beta;
//   - flops, from a float32 GEMM every rank runs at the same time (ranks
//     share the machine as they do in a job), the slowest rank's rate.
type calibrateTask struct {
	out    string
	bytes  int
	gemm   int
	repeat int
	world  int
}

func (t *calibrateTask) flags(fs *flag.FlagSet) {
	fs.StringVar(&t.out, "out", "", "write the model as JSON to `FILE` (rank 0; default: print it only)")
	fs.IntVar(&t.bytes, "bytes", 16<<20, "the large all-gather's output, in `BYTES`")
	fs.IntVar(&t.gemm, "gemm", 512, "the GEMM's size `N` (N x N x N)")
	fs.IntVar(&t.repeat, "repeat", 20, "`N` timed repetitions of each measurement (the median is kept)")
	fs.IntVar(&t.world, "world", 2, "ranks in this process when not launched")
}

func (t *calibrateTask) setup(_ context.Context, env Env, args []string) error {
	switch {
	case t.bytes < 1024 || t.bytes > 1<<30:
		return fmt.Errorf("--bytes %d: want 1024 to 1 GiB", t.bytes)
	case t.gemm < 16 || t.gemm > 8192:
		return fmt.Errorf("--gemm %d: want 16 to 8192", t.gemm)
	case t.repeat < 3 || t.repeat > 10000:
		return fmt.Errorf("--repeat %d: want 3 to 10000", t.repeat)
	case worldSize(env, t.world) < 2:
		return errors.New("calibrate needs at least 2 ranks (launcher run -n 2 calibrate)")
	}
	return noArgs(args)
}

func (t *calibrateTask) run(ctx context.Context, env Env) int {
	err := ranks(ctx, env, t.world, func(ctx context.Context, w *collective.World) error {
		m, err := t.measure(ctx, w)
		if err != nil || w.Rank() != 0 {
			return err
		}
		b, _ := json.MarshalIndent(m, "", "  ")
		fmt.Fprintf(env.Stdout, "%s\n", b)
		if t.out != "" {
			return os.WriteFile(t.out, append(b, '\n'), 0o644)
		}
		return nil
	})
	if err != nil {
		return failure(env, "calibrate", err)
	}
	return 0
}

// modelUsage is the help of --model.
const modelUsage = "plan with the cost model in `FILE` (worker calibrate writes one; default: the built-in cpu model)"

// readPlanner is the planner of --model: the model it reads
// (placement.DefaultModel for ""), within a placement.DefaultBudget that all
// the planning of the workload's setup shares, so that no arguments make it
// run long.
func readPlanner(path string) (*placement.Planner, error) {
	if path == "" {
		return placement.DefaultPlanner(), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--model: %w", err)
	}
	defer f.Close()
	m, err := placement.DecodeModel(f, path)
	if err != nil {
		return nil, fmt.Errorf("--model: %w", err)
	}
	return placement.NewPlanner(m, placement.DefaultBudget), nil
}

// median runs f repeat times after one warm-up and returns the median time,
// the same on every rank of g (the slowest rank's).
func (t *calibrateTask) median(ctx context.Context, g *collective.Group, f func() error) (time.Duration, error) {
	if err := f(); err != nil {
		return 0, err
	}
	ts := make([]float64, t.repeat)
	for i := range ts {
		if err := g.Barrier(ctx); err != nil {
			return 0, err
		}
		start := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		ts[i] = time.Since(start).Seconds()
	}
	slices.Sort(ts)
	med := []float64{ts[len(ts)/2]}
	if err := collective.AllReduce(ctx, g, med, collective.Max); err != nil {
		return 0, err
	}
	return time.Duration(med[0] * 1e9), nil
}

func (t *calibrateTask) measure(ctx context.Context, w *collective.World) (placement.Model, error) {
	world, err := w.WorldGroup(ctx)
	if err != nil {
		return placement.Model{}, err
	}
	n := w.Size()
	gather := func(g *collective.Group, elems int) func() error {
		in, out := make([]float32, elems), make([]float32, elems*g.Size())
		counts := make([]int, g.Size())
		for i := range counts {
			counts[i] = elems
		}
		return func() error { return collective.AllGather(ctx, g, in, out, counts) }
	}
	tWorld, err := t.median(ctx, world, gather(world, 1))
	if err != nil {
		return placement.Model{}, err
	}
	gamma, alpha := tWorld.Seconds()/2, tWorld.Seconds()/2/float64(n-1)
	if n > 2 {
		// Pairs: ranks 2k and 2k+1 (an odd last rank alone).
		pair := []int{w.Rank() &^ 1, w.Rank() | 1}
		if pair[1] >= n {
			pair = pair[:1]
		}
		g, err := w.Group(ctx, pair)
		if err != nil {
			return placement.Model{}, err
		}
		tPair, err := t.median(ctx, world, gather(g, 1))
		if err != nil {
			return placement.Model{}, err
		}
		alpha = max(0, (tWorld.Seconds()-tPair.Seconds())/float64(n-2))
		gamma = max(0, tPair.Seconds()-alpha)
	}
	elems := max(1, t.bytes/4/n)
	tBig, err := t.median(ctx, world, gather(world, elems))
	if err != nil {
		return placement.Model{}, err
	}
	sent := float64(n-1) * float64(elems) * 4
	beta := sent / max(tBig.Seconds()-gamma-float64(n-1)*alpha, 1e-9)

	p, err := cpu.New(cpu.Options{Threads: max(1, runtime.GOMAXPROCS(0)/n)})
	if err != nil {
		return placement.Model{}, err
	}
	k := t.gemm
	a, b, c := make([]float32, k*k), make([]float32, k*k), make([]float32, k*k)
	for i := range a {
		a[i], b[i] = float32(i%7)*0.1, float32(i%5)*0.1
	}
	params := kernels.GemmParams{M: k, N: k, K: k, Alpha: 1, LDA: k, LDB: k, LDC: k}
	tGemm, err := t.median(ctx, world, func() error { return p.Sgemm(params, a, b, c) })
	if err != nil {
		return placement.Model{}, err
	}
	host, _ := os.Hostname()
	m := placement.Model{
		Name:  fmt.Sprintf("calibrated: %s transport, %d ranks on %s, %s", w.Transport().Name(), n, host, time.Now().UTC().Format("2006-01-02")),
		Gamma: gamma, Alpha: alpha, Beta: beta,
		Flops:     2 * float64(k) * float64(k) * float64(k) / tGemm.Seconds(),
		ElemBytes: 4,
	}
	return m, m.Validate()
}
