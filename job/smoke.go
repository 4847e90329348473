package job

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"go.uber.org/zap"
)

// helloTask is `worker hello`.
type helloTask struct{}

func (*helloTask) flags(*flag.FlagSet)                                 {}
func (*helloTask) setup(_ context.Context, _ Env, args []string) error { return noArgs(args) }

func (*helloTask) run(ctx context.Context, env Env) int {
	rank, world := env.Getenv("RANK"), env.Getenv("WORLD_SIZE")
	fmt.Fprintf(env.Stdout, "hello from rank %s of %s\n", rank, world)
	env.Run.Log.Info("hello", zap.String("world", world))
	return 0
}

// exitTask is `worker exit CODE [RANK]`.
type exitTask struct {
	code int
	rank string // "" for every rank
}

func (*exitTask) flags(*flag.FlagSet) {}

func (t *exitTask) setup(_ context.Context, _ Env, args []string) error {
	if len(args) < 1 || len(args) > 2 {
		return fmt.Errorf("want CODE [RANK]")
	}
	code, err := strconv.Atoi(args[0])
	if err != nil {
		return fmt.Errorf("bad code %q", args[0])
	}
	t.code = code
	if len(args) > 1 {
		t.rank = args[1]
	}
	return nil
}

func (t *exitTask) run(ctx context.Context, env Env) int {
	if t.rank != "" && t.rank != env.Getenv("RANK") {
		<-ctx.Done() // a healthy peer, until the launcher stops it
		return 0
	}
	time.Sleep(100 * time.Millisecond)
	fmt.Fprintf(env.Stderr, "rank %s: exiting with code %d\n", env.Getenv("RANK"), t.code)
	return t.code
}

// sleepTask is `worker sleep DUR`.
type sleepTask struct{ d time.Duration }

func (*sleepTask) flags(*flag.FlagSet) {}

func (t *sleepTask) setup(_ context.Context, _ Env, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("want DUR")
	}
	d, err := time.ParseDuration(args[0])
	if err != nil {
		return err
	}
	t.d = d
	return nil
}

func (t *sleepTask) run(ctx context.Context, env Env) int {
	select {
	case <-time.After(t.d):
	case <-ctx.Done():
	}
	return 0
}

// barrierTask joins the job and passes one barrier: the launch-overhead
// probe. With --stall-rank R, rank R stalls (in stall) instead of entering
// the barrier, until the job is torn down: a hang to diagnose.
type barrierTask struct {
	start time.Time
	stall int
}

func (t *barrierTask) flags(fs *flag.FlagSet) {
	fs.IntVar(&t.stall, "stall-rank", -1, "this `RANK` stalls before the barrier, never entering it (a hang to diagnose)")
}

func (t *barrierTask) setup(_ context.Context, _ Env, args []string) error {
	t.start = time.Now()
	return noArgs(args)
}

// stall waits until ctx ends: a rank stuck in code of its own.
func stall(ctx context.Context) {
	<-ctx.Done()
}

func (t *barrierTask) run(ctx context.Context, env Env) int {
	cfg := bootstrap.EnvConfig()
	cfg.Logger = env.Run.Log
	cfg.Backends = collectiveBackends(env.Getenv)
	w, err := bootstrap.Join(ctx, cfg)
	if err != nil {
		return failure(env, "barrier", err)
	}
	defer w.Close()
	c, err := w.WorldGroup(ctx)
	if err == nil && w.Rank() == t.stall {
		stall(ctx)
	}
	if err == nil {
		err = c.Barrier(ctx)
	}
	if err != nil {
		w.Fail(err)
		return failure(env, "barrier", err)
	}
	if w.Rank() == 0 {
		fmt.Fprintf(env.Stdout, "barrier: %d ranks joined and passed a barrier %.1f ms after rank 0 started\n",
			w.Size(), float64(time.Since(t.start).Microseconds())/1000)
	}
	return 0
}
