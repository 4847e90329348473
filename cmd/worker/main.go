// Command worker runs one rank of a meshrun job; the launcher starts one per rank
// with RANK, WORLD_SIZE and the other variables set. `worker` alone lists the
// workloads.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshrun/meshrun/job"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := job.Main(ctx, job.Env{Args: os.Args[1:], Getenv: os.Getenv, Stdout: os.Stdout, Stderr: os.Stderr})
	stop()
	os.Exit(code)
}
