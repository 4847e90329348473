// Command ranktest is a rank for the launcher's integration tests: it joins the
// job, then runs barriers with runlog spans and progress, and fails as told:
// with an exit code, SIGKILL, a hang, or a crash of its Go runtime (-crash),
// at a step or when SIGUSR2 tells it to (-fault). Stopped by SIGTERM or
// SIGINT, it exits 128+signal, as the worker does.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/runlog"
)

var (
	steps     = flag.Int("steps", 10, "barriers to run (0: until stopped)")
	pause     = flag.Duration("pause", 20*time.Millisecond, "time between barriers")
	failRank  = flag.Int("fail-rank", -1, "rank that fails")
	failCode  = flag.Int("fail-code", 3, "its exit code")
	killRank  = flag.Int("kill-rank", -1, "rank that kills itself with SIGKILL")
	failAt    = flag.Int("at", 3, "step at which the rank fails")
	linger    = flag.Bool("linger", false, "the failing rank, its failure recorded and its world closed, stays until SIGTERM before it exits -fail-code: its peers fail on it and exit first")
	stallRank = flag.Int("stall-rank", -1, "rank that never joins")
	blockRank = flag.Int("block-rank", -1, "rank that stops before the barrier of step -at (joined, alive, never entering it)")
	warn      = flag.Bool("warn", false, "every rank logs the same warning at the start")
	crashRank = flag.Int("crash-rank", -1, "rank whose Go runtime crashes at step -at, as -crash says")
	crashKind = flag.String("crash", "panic", "how -crash-rank crashes: panic (in a goroutine of its own), nil (a nil pointer dereference: SIGSEGV), "+
		"segv (raises SIGSEGV on itself), fatal (concurrent map writes)")
	late  = flag.Bool("late", false, "-crash-rank and -kill-rank close their world first and crash or die only once the launcher's teardown began, before its SIGTERM: their peers fail on them and exit first")
	fault = flag.String("fault", "", "what a rank does at its next step once SIGUSR2 reaches it: exit (fails with -fail-code), hang (stops before the barrier), or a -crash kind")
)

func main() {
	flag.Parse()
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	var got atomic.Int32
	go func() {
		s := <-sigs
		got.Store(int32(s.(syscall.Signal)))
		cancel()
	}()
	code, own := run(ctx, rank)
	signal.Stop(sigs)
	if s := got.Load(); s != 0 && code != 0 && !own {
		code = 128 + int(s)
	}
	os.Exit(code)
}

// crash makes the Go runtime crash as kind says.
func crash(kind string, rank, step int) {
	fmt.Fprintf(os.Stderr, "rank %d: crashing (%s) at step %d\n", rank, kind, step)
	switch kind {
	case "panic":
		go func() { panic(fmt.Sprintf("injected panic at step %d", step)) }()
	case "nil":
		var p *int
		*p = step
	case "segv":
		syscall.Kill(os.Getpid(), syscall.SIGSEGV)
	case "fatal":
		runtime.GOMAXPROCS(4)
		m := map[int]int{}
		for i := 0; i < 4; i++ {
			go func() {
				for j := 0; ; j++ {
					m[j%64] = j
				}
			}()
		}
	default:
		fmt.Fprintf(os.Stderr, "rank %d: unknown crash %q\n", rank, kind)
		os.Exit(2)
	}
	time.Sleep(time.Minute)
}

// awaitTeardown returns once the launcher's events.jsonl, in the job folder
// above the rank's, records the teardown.
func awaitTeardown() {
	events := filepath.Join(filepath.Dir(os.Getenv("MESHRUN_RANK_DIR")), "events.jsonl")
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if b, _ := os.ReadFile(events); bytes.Contains(b, []byte(`"event":"teardown"`)) {
			return
		}
	}
}

// run runs the rank; own: the code is its own, not the signal's doing.
func run(ctx context.Context, rank int) (code int, own bool) {
	var usr2 atomic.Bool
	if *fault != "" {
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGUSR2)
		go func() {
			<-c
			usr2.Store(true)
		}()
	}

	rl, err := runlog.Open(runlog.Options{Stdout: os.Stdout, Stderr: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1, false
	}
	defer rl.Close()
	if *warn {
		rl.Log.Warn("the same warning on every rank")
	}
	if rank == *stallRank {
		<-ctx.Done()
		return 0, true
	}
	fail := func(err error) (int, bool) {
		rl.Fail(err)
		fmt.Fprintf(os.Stderr, "rank %d: %v\n", rank, err)
		return 1, false
	}
	sp := rl.Span("join", "rendezvous")
	w, err := bootstrap.Join(ctx, bootstrap.EnvConfig())
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
		if usr2.Load() {
			switch *fault {
			case "exit":
				*failRank, *failAt, *linger = rank, k, false
			case "hang":
				*blockRank, *failAt = rank, k
			default:
				crash(*fault, rank, k)
			}
		}
		if k == *failAt && (rank == *crashRank || rank == *killRank) && *late {
			w.Close()
			fmt.Fprintf(os.Stderr, "rank %d: world closed at step %d, waiting for the teardown\n", rank, k)
			awaitTeardown()
		}
		if k == *failAt && rank == *crashRank {
			crash(*crashKind, rank, k)
		}
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
			return *failCode, true
		}
		if k == *failAt && rank == *blockRank {
			fmt.Fprintf(os.Stderr, "rank %d: blocking before the barrier of step %d\n", rank, k)
			<-ctx.Done()
			return 0, true
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
	return 0, true
}
