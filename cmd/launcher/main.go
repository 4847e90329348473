// Command launcher plans sharded ops and launches the ranks of a job.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshrun/meshrun/launch"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := launch.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
