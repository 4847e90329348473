package job

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/providers"
)

// ranks runs fn on this process's rank of a launched job (joined over NATS), or,
// when the process was not launched (no MESHRUN_NATS_URL), on n ranks in this
// process: `worker linear --mesh tp=4 ...` works alone.
func ranks(ctx context.Context, env Env, n int, fn func(ctx context.Context, w *collective.World) error) error {
	if env.Getenv("MESHRUN_NATS_URL") == "" {
		return InProcess(ctx, n, fn)
	}
	w, err := collective.Join(ctx, collective.EnvConfig())
	if err != nil {
		return err
	}
	defer w.Close()
	if err := fn(ctx, w); err != nil {
		w.Fail(err)
		return err
	}
	return nil
}

// worldSize is the job's world size, or def when the process was not launched.
func worldSize(env Env, def int) int {
	if n, err := strconv.Atoi(env.Getenv("WORLD_SIZE")); err == nil && n > 0 {
		return n
	}
	return def
}

// newFlags returns a flag set that reports errors instead of printing them.
func newFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// usageError prints one line and returns ExitUsage.
func usageError(env Env, workload string, err error) int {
	fmt.Fprintf(env.Stderr, "worker %s: %v\n", workload, err)
	return ExitUsage
}

// failure prints one line and returns 1.
func failure(env Env, workload string, err error) int {
	fmt.Fprintf(env.Stderr, "worker %s: %v\n", workload, err)
	return 1
}

type linearKernels = kernels.Kernels

func dispatcher(choice string) (kernels.Kernels, error) {
	return providers.New(choice, nil)
}

func printJSON(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(w, "%s\n", b)
}
