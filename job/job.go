// Package job holds the workloads a worker runs on each rank: the smoke tests
// (hello, exit, sleep, barrier) and the linear-layer jobs (linear, mlp, verify).
// Main is the whole worker command line; cmd/worker only calls it.
package job

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/meshrun/meshrun/runlog"
)

// Env is what a workload gets from its process: arguments, environment, output,
// and the rank's logs (log.jsonl, trace.json, error.json, progress; a nil Run
// writes nothing).
type Env struct {
	Args   []string
	Getenv func(string) string
	Stdout io.Writer
	Stderr io.Writer
	Run    *runlog.Rank
}

// Workload runs one rank's part of a job and returns the process exit code.
type Workload func(ctx context.Context, env Env) int

// workloads is every workload by name. It is never changed at run time.
var workloads = map[string]struct {
	run  Workload
	help string
}{
	"hello":   {hello, "print the rank, log one line, exit 0"},
	"exit":    {exitCode, "exit CODE [RANK]: exit CODE (only on rank RANK; the others wait to be stopped)"},
	"sleep":   {sleep, "sleep DUR, exit 0"},
	"barrier": {barrier, "join the job over NATS, pass one barrier, print the time from start"},
	"linear":  {linearWorkload, "one sharded linear layer forward and backward, checked against float64 (--mesh --x --w [--b] ...)"},
	"verify":  {verifyWorkload, "every mesh and placement combination at even and uneven sizes, checked against float64 and the plans ([--quick])"},
	"mlp":     {mlpWorkload, "train the Megatron MLP block (--mesh --tokens --hidden --ffn --steps [--sequence-parallel])"},
}

// ExitUsage is the exit code for bad arguments.
const ExitUsage = 2

// Usage lists the workloads.
func Usage() string {
	var names []string
	for n := range workloads {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: worker WORKLOAD [ARGS...]\n\nworkloads:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-8s %s\n", n, workloads[n].help)
	}
	return b.String()
}

// Main runs the workload named by env.Args[0].
func Main(ctx context.Context, env Env) int {
	if len(env.Args) == 0 {
		fmt.Fprint(env.Stderr, Usage())
		return ExitUsage
	}
	w, ok := workloads[env.Args[0]]
	if !ok {
		fmt.Fprintf(env.Stderr, "worker: unknown workload %q\n%s", env.Args[0], Usage())
		return ExitUsage
	}
	if env.Run == nil {
		rl, err := runlog.Open(runlog.Options{Getenv: env.Getenv, Stdout: env.Stdout, Stderr: env.Stderr})
		if err != nil {
			fmt.Fprintln(env.Stderr, "worker:", err)
			return 1
		}
		defer rl.Close()
		defer rl.Recover()
		env.Run = rl
	}
	return w.run(ctx, env)
}
