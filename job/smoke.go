package job

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/meshrun/meshrun/collective"
)

func hello(ctx context.Context, env Env) int {
	rank, world := env.Getenv("RANK"), env.Getenv("WORLD_SIZE")
	fmt.Fprintf(env.Stdout, "hello from rank %s of %s\n", rank, world)
	env.Run.Log.Info("hello", zap.String("world", world))
	return 0
}

func exitCode(ctx context.Context, env Env) int {
	if len(env.Args) < 2 {
		fmt.Fprintln(env.Stderr, "worker exit: want CODE [RANK]")
		return ExitUsage
	}
	code, err := strconv.Atoi(env.Args[1])
	if err != nil {
		fmt.Fprintf(env.Stderr, "worker exit: bad code %q\n", env.Args[1])
		return ExitUsage
	}
	if len(env.Args) > 2 && env.Args[2] != env.Getenv("RANK") {
		<-ctx.Done() // a healthy peer, until the launcher stops it
		return 0
	}
	time.Sleep(100 * time.Millisecond)
	fmt.Fprintf(env.Stderr, "rank %s: exiting with code %d\n", env.Getenv("RANK"), code)
	return code
}

func sleep(ctx context.Context, env Env) int {
	if len(env.Args) < 2 {
		fmt.Fprintln(env.Stderr, "worker sleep: want DUR")
		return ExitUsage
	}
	d, err := time.ParseDuration(env.Args[1])
	if err != nil {
		fmt.Fprintf(env.Stderr, "worker sleep: %v\n", err)
		return ExitUsage
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	return 0
}

// barrier joins the job and passes one barrier: the launch-overhead probe.
func barrier(ctx context.Context, env Env) int {
	start := time.Now()
	cfg := collective.EnvConfig()
	cfg.Logger = env.Run.Log
	w, err := collective.Join(ctx, cfg)
	if err != nil {
		return failure(env, "barrier", err)
	}
	defer w.Close()
	c, err := w.WorldGroup(ctx)
	if err == nil {
		err = c.Barrier(ctx)
	}
	if err != nil {
		w.Fail(err)
		return failure(env, "barrier", err)
	}
	if w.Rank() == 0 {
		fmt.Fprintf(env.Stdout, "barrier: %d ranks joined and passed a barrier %.1f ms after rank 0 started\n",
			w.Size(), float64(time.Since(start).Microseconds())/1000)
	}
	return 0
}
