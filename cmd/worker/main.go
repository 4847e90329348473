// Command worker runs one rank of a meshrun job; the launcher starts one per rank
// with RANK, WORLD_SIZE and the other variables set. `worker` alone lists the
// workloads.
package main

import (
	"context"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"github.com/meshrun/meshrun/job"
)

func main() {
	// SIGINT and SIGTERM cancel the workload, which ends its collectives
	// (its peers learn why) and returns; the worker then exits as a shell
	// reports a process ended by that signal, 128+N (143 for SIGTERM), so
	// that the launcher, and anyone else, can tell it was stopped from outside.
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	var got atomic.Int32
	go func() {
		s := <-sigs
		got.Store(int32(s.(syscall.Signal)))
		cancel()
	}()
	code := job.Main(ctx, job.Env{Args: os.Args[1:], Getenv: os.Getenv, Stdout: os.Stdout, Stderr: os.Stderr})
	signal.Stop(sigs)
	if s := got.Load(); s != 0 && code != 0 {
		code = 128 + int(s)
	}
	os.Exit(code)
}
