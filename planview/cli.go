// Package planview is the plans a job would run, printed without running it:
// `launcher plan`. For one op (--op) or a whole block (--block mlp,
// transformer) it prints the layouts, collectives and bytes of the forward
// and the backward as packages spmd, placement and linear/layout plan them,
// for the MLP block the memory a rank needs, and for the transformer on a mesh
// with a pp dim the pipeline's modelled timeline (package pipeline,
// docs/pipeline.md); --op redistribute prints the
// steps that move a tensor from one layout to another. It starts no rank and
// does not import package launch, which runs jobs; cmd/launcher hands it the
// plan command.
package planview

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/meshrun/meshrun/internal/exitcode"
)

// Exit codes of `launcher plan`, the launcher's own (package
// internal/exitcode).
const (
	// ExitUsage is the exit code for bad flags and plans that cannot be made
	// (beyond the planning budget, a layout no rule reaches).
	ExitUsage = exitcode.Usage
	// ExitInterrupted is the exit code when an interrupt (ctx done) stops
	// the planning.
	ExitInterrupted = exitcode.Interrupted
)

// Main runs `launcher plan` with args (the arguments after "plan") and
// returns the process exit code: 0 with the plan on stdout, -h's help on
// stdout, or one line "launcher plan: ..." on stderr with ExitUsage, or
// ExitInterrupted when ctx is done first.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := ParsePlanFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, planHelp())
		return 0
	}
	if err == nil {
		o.Colour = colourTerminal(stdout)
		err = o.Validate()
	}
	if err == nil {
		err = RunPlanContext(ctx, stdout, o)
	}
	if err != nil {
		fmt.Fprintf(stderr, "launcher plan: %v\n", err)
		if ctx.Err() != nil {
			return ExitInterrupted
		}
		return ExitUsage
	}
	return 0
}

// colourTerminal reports whether a drawing on w may be coloured: w is a
// terminal and NO_COLOR (no-color.org) is unset.
func colourTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("NO_COLOR") != "" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
