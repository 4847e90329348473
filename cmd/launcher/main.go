// Command launcher plans sharded ops and launches the ranks of a job, and
// views a job's logs.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/meshrun/meshrun/launch"
	"github.com/meshrun/meshrun/logview"
	"github.com/meshrun/meshrun/planview"
	"github.com/meshrun/meshrun/report"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

// run is the command line: plan prints the plans a job would run (package
// planview), logs and trace view a job's folder (package logview), report
// makes its page (package report), every other command is package launch's.
func run(ctx context.Context, args []string) int {
	if len(args) > 0 {
		switch args[0] {
		case "plan":
			return planview.Main(ctx, args[1:], os.Stdout, os.Stderr)
		case "logs":
			return logview.LogsMain(ctx, args[1:], os.Stdout, os.Stderr)
		case "trace":
			return logview.TraceMain(args[1:], os.Stdout, os.Stderr)
		case "report":
			return report.Main(args[1:], os.Stdout, os.Stderr)
		}
	}
	return launch.Main(ctx, args, os.Stdout, os.Stderr)
}
