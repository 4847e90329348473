// Command ranktest is a rank for the launcher's integration tests: it joins the
// job, then runs barriers with runlog spans and progress, and fails as told.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/runlog"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx)
	stop()
	os.Exit(code)
}

func run(ctx context.Context) int {
	steps := flag.Int("steps", 10, "barriers to run (0: until stopped)")
	pause := flag.Duration("pause", 20*time.Millisecond, "time between barriers")
	failRank := flag.Int("fail-rank", -1, "rank that fails")
	failCode := flag.Int("fail-code", 3, "its exit code")
	killRank := flag.Int("kill-rank", -1, "rank that kills itself with SIGKILL")
	failAt := flag.Int("at", 3, "step at which the rank fails")
	linger := flag.Bool("linger", false, "the failing rank, its failure recorded and its world closed, stays until SIGTERM before it exits -fail-code: its peers fail on it and exit first")
	stallRank := flag.Int("stall-rank", -1, "rank that never joins")
	blockRank := flag.Int("block-rank", -1, "rank that stops before the barrier of step -at (joined, alive, never entering it)")
	warn := flag.Bool("warn", false, "every rank logs the same warning at the start")
	flag.Parse()
	rank, _ := strconv.Atoi(os.Getenv("RANK"))

	rl, err := runlog.Open(runlog.Options{Stdout: os.Stdout, Stderr: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer rl.Close()
	if *warn {
		rl.Log.Warn("the same warning on every rank")
	}
	if rank == *stallRank {
		<-ctx.Done()
		return 0
	}
	fail := func(err error) int {
		rl.Fail(err)
		fmt.Fprintf(os.Stderr, "rank %d: %v\n", rank, err)
		return 1
	}
	sp := rl.Span("join", "rendezvous")
	w, err := collective.Join(ctx, collective.EnvConfig())
	sp.End()
	if err != nil {
		return fail(err)
	}
	defer w.Close()
	c, err := w.WorldGroup(ctx)
	if err != nil {
		return fail(err)
	}
	for k := 1; *steps == 0 || k <= *steps; k++ {
		t0 := time.Now()
		if k == *failAt && rank == *failRank {
			rl.Fail(errors.New("injected failure"))
			if *linger {
				// Its peers see the world close and fail blaming it; the
				// launcher sees their exits first and tears the job down.
				w.Close()
				fmt.Fprintf(os.Stderr, "rank %d: injected failure at step %d, lingering until SIGTERM\n", rank, k)
				<-ctx.Done()
			}
			fmt.Fprintf(os.Stderr, "rank %d: injected failure at step %d, exiting %d\n", rank, k, *failCode)
			rl.Close()
			return *failCode
		}
		if k == *failAt && rank == *blockRank {
			fmt.Fprintf(os.Stderr, "rank %d: blocking before the barrier of step %d\n", rank, k)
			<-ctx.Done()
			return 0
		}
		if k == *failAt && rank == *killRank {
			rl.Close()
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		sp := rl.Span("barrier", "collective", runlog.Arg{Key: "step", Value: strconv.Itoa(k)})
		err := c.Barrier(ctx)
		sp.End()
		if err != nil {
			return fail(fmt.Errorf("step %d: %w", k, err))
		}
		rl.Progress(k, *steps, 1/float64(k), time.Since(t0))
		select {
		case <-time.After(*pause):
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
	if rank == 0 {
		fmt.Println("done")
	}
	return 0
}
