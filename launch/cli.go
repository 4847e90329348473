// Package launch is the launcher: it starts and supervises the ranks of a job
// (`launcher run`), writing the job's folder that package logview reads
// (`launcher logs`, `logs why`, `trace`), and inspects and converts
// checkpoints (`launcher ckpt`). Package planview prints the plans a job
// would run (`launcher plan`).
package launch

import (
	"context"
	"fmt"
	"io"

	"github.com/meshrun/meshrun/internal/exitcode"
	"github.com/meshrun/meshrun/launch/probe"
)

// ExitUsage is the exit code for bad flags and inputs that cannot be run.
const ExitUsage = exitcode.Usage

const usage = `usage: launcher COMMAND [flags]

commands:
  plan   show how an op is sharded: layouts, collectives and bytes, forward and backward
         launcher plan --mesh dp=2,tp=2 --op linear --x 8x16:[S(0),R] --w 32x16:[R,S(0)] --b 32:[R,S(0)]
         launcher plan --mesh dp=2,tp=2 --block mlp --tokens 64 --hidden 32 --ffn 128 [--sequence-parallel]
  run    start the ranks of a job and supervise them (launcher run -h)
         launcher run -n 4 WORKLOAD [ARGS...]      launcher run -n 4 -- PROGRAM [ARGS...]
  logs   the ranks' logs merged by time; "logs why" names the root cause (launcher logs -h)
         launcher logs [JOB|latest] [--rank 0,4-7] [--level warn] [--grep RE] [--tail N] [-f] [--collapse]
         launcher logs why [JOB|latest]
  stacks every running rank's stacks, grouped, the odd one out first (the job goes on)
         launcher stacks [JOB|latest]
  trace  every rank's trace merged into one Chrome/Perfetto file
         launcher trace [JOB|latest] -o trace.json
  report one HTML page about a job: outcome, loss and step time per step, each rank's
         step split, bytes, one step across the ranks (launcher report -h)
         launcher report [JOB|latest] [-o report.html]
  ckpt   inspect a checkpoint, or gather it into one safetensors file
         launcher ckpt inspect DIR      launcher ckpt convert DIR --to model.safetensors

"launcher COMMAND -h" lists a command's flags; "worker WORKLOAD -h" a workload's.
`

// Main runs the launcher's command line and returns the process exit code:
// every command but plan (package planview) and logs and trace, which view a
// job's folder (package logview): cmd/launcher hands those to their package.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return ExitUsage
	}
	switch args[0] {
	case "run":
		return runMain(ctx, args[1:], stdout, stderr)
	case "ckpt":
		return ckptMain(args[1:], stdout, stderr)
	case "stacks":
		return probe.StacksMain(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "launcher: unknown command %q\n%s", args[0], usage)
	return ExitUsage
}
