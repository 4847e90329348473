// Package job holds the workloads a worker runs on each rank: the smoke tests
// (hello, exit, sleep, barrier) and the linear-layer jobs (linear, mlp, verify).
// Main is the whole worker command line; cmd/worker only calls it.
package job

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/meshrun/meshrun/internal/flaghelp"
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

// task is one run of a workload, in three steps: flags registers its flags;
// setup checks the parsed flags and the positional arguments (with the job's
// WORLD_SIZE, MESHRUN_DEVICE... from the environment) and prepares what run
// needs, doing no work and joining nothing, an error being a usage error (its
// ctx carries the planning budget of the whole setup); run does the work and
// returns the exit code.
type task interface {
	flags(fs *flag.FlagSet)
	setup(ctx context.Context, env Env, args []string) error
	run(ctx context.Context, env Env) int
}

// workloads is every workload by name. It is never changed at run time.
var workloads = map[string]struct {
	new     func() task
	args    string // the positional arguments after the flags
	summary string
}{
	"hello":     {func() task { return &helloTask{} }, "", "print the rank, log one line, exit 0"},
	"exit":      {func() task { return &exitTask{} }, "CODE [RANK]", "exit CODE (only on rank RANK; the others wait to be stopped)"},
	"sleep":     {func() task { return &sleepTask{} }, "DUR", "sleep DUR (e.g. 30s), exit 0"},
	"barrier":   {func() task { return &barrierTask{} }, "", "join the job over NATS, pass one barrier, print the time from start"},
	"linear":    {func() task { return &linearTask{} }, "", "one sharded linear layer forward and backward, checked against float64"},
	"verify":    {func() task { return &verifyTask{} }, "", "every op with a rule on every mesh (1-, 2- and 3-D) and placement, at even and uneven sizes, checked against float64 and the plans"},
	"calibrate": {func() task { return &calibrateTask{} }, "", "measure the planners' cost model (latency, bandwidth, GEMM rate) on this job's transport and ranks; launcher plan --model reads it"},
	"mlp":       {func() task { return &mlpTask{} }, "", "train the Megatron MLP block (SGD, mean squared error), optionally sequence parallel, with checkpoints"},
	"gpt":       {func() task { return &gptTask{} }, "", "train a small GPT on the characters of a text, tensor parallel in Megatron's layout, data parallel over dp, with experts over ep or ring attention over cp (AdamW or SGD), and sample from it"},
	"attention": {func() task { return &attentionTask{} }, "", "ring attention with the sequence split over a cp mesh dim (contiguous or zigzag), forward and backward timed, with the bytes it sent and the memory it held"},
	"moe":       {func() task { return &moeTask{} }, "", "a mixture-of-experts layer's forward and backward on a mesh of dp, ep and tp (tokens dispatched by all-to-all), timed, or on given tensors with its results written"},
}

// ExitUsage is the exit code for bad arguments.
const ExitUsage = 2

// EnvCheck, set to 1, makes the worker check its arguments and stop: Main
// parses the workload's flags and runs its setup, as a rank would with the
// job's WORLD_SIZE, RANK, MESHRUN_DEVICE, MESHRUN_KERNELS and MESHRUN_DTYPE,
// but opens no logs, joins nothing and does no work; it exits 0, or
// ExitUsage with the problem on stderr. The launcher runs one such check
// before it starts any rank (launch.EnvCheck mirrors the name).
const EnvCheck = "MESHRUN_CHECK"

// CheckDevice, as EnvCheck's value, asks the worker for the ranks' device
// alone, with no workload: Main checks MESHRUN_DEVICE, MESHRUN_KERNELS and
// MESHRUN_DTYPE as every compute workload would (deviceFlags.resolve, against
// the providers compiled into this binary) and prints the device the ranks'
// tensors live on (cpu, sim or cuda), exit 0; or the problem on stderr, exit
// ExitUsage. The launcher links no provider: it asks this of the worker
// before it starts any rank, and of a program's job too (launch.checkDevice
// mirrors the value).
const CheckDevice = "device"

// EnvRestartCount is the launcher's count of restarts before this attempt
// (torchrun's name): mlp with --save resumes from its newest checkpoint when
// it is above 0.
const EnvRestartCount = "TORCHELASTIC_RESTART_COUNT"

// Usage lists the workloads.
func Usage() string {
	var names []string
	for n := range workloads {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: worker WORKLOAD [FLAGS] [ARGS...]\n\nworkloads:\n")
	for _, n := range names {
		w := workloads[n]
		line := w.summary
		if w.args != "" {
			line = w.args + ": " + line
		}
		fmt.Fprintf(&b, "  %-8s %s\n", n, line)
	}
	b.WriteString("\n\"worker WORKLOAD -h\" lists a workload's flags. The launcher starts one worker per rank\n" +
		"(launcher run -n N WORKLOAD ...) with RANK, WORLD_SIZE and MESHRUN_* set; linear, verify,\n" +
		"mlp and moe also run alone, their ranks in one process.\n")
	return b.String()
}

// workloadUsage is `worker NAME -h`: the usage line, what it does, every flag.
func workloadUsage(name string, fs *flag.FlagSet) string {
	w := workloads[name]
	var b strings.Builder
	fmt.Fprintf(&b, "usage: worker %s", name)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		b.WriteString(" [FLAGS]")
	}
	if w.args != "" {
		fmt.Fprintf(&b, " %s", w.args)
	}
	fmt.Fprintf(&b, "\n  %s\n\nflags:\n", w.summary)
	flaghelp.Flags(&b, fs)
	return b.String()
}

// Main runs the workload named by env.Args[0].
func Main(ctx context.Context, env Env) int {
	// Ranks run in this process when it was not launched: they share its
	// output, one write at a time.
	env.Stdout, env.Stderr = &lockedWriter{w: env.Stdout}, &lockedWriter{w: env.Stderr}
	if env.Getenv(EnvCheck) == CheckDevice {
		return checkDevice(env)
	}
	if len(env.Args) == 0 {
		fmt.Fprint(env.Stderr, Usage())
		return ExitUsage
	}
	name := env.Args[0]
	switch name {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(env.Stdout, Usage())
		return 0
	}
	w, ok := workloads[name]
	if !ok {
		fmt.Fprintf(env.Stderr, "worker: unknown workload %q\n%s", name, Usage())
		return ExitUsage
	}
	t := w.new()
	fs := newFlags(name)
	t.flags(fs)
	if err := fs.Parse(env.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(env.Stdout, workloadUsage(name, fs))
			return 0
		}
		fmt.Fprintf(env.Stderr, "worker %s: %v (worker %s -h lists the flags)\n", name, flaghelp.Error(fs, err), name)
		return ExitUsage
	}
	check := env.Getenv(EnvCheck) == "1"
	if env.Run == nil && !check {
		rl, err := runlog.Open(runlog.Options{Getenv: env.Getenv, Stdout: env.Stdout, Stderr: env.Stderr})
		if err != nil {
			fmt.Fprintln(env.Stderr, "worker:", err)
			return 1
		}
		defer rl.Close()
		defer rl.Recover()
		env.Run = rl
	}
	// Planning in setup shares one budget, its planner's (readPlanner).
	if err := t.setup(ctx, env, fs.Args()); err != nil {
		return usageError(env, name, err)
	}
	if check {
		return 0
	}
	return t.run(ctx, env)
}

// checkDevice is the worker in CheckDevice mode: the ranks' device from the
// environment the launcher gives its ranks, or the problem with it.
func checkDevice(env Env) int {
	d, err := deviceFlags{}.resolve(env)
	if err != nil {
		fmt.Fprintln(env.Stderr, err)
		return ExitUsage
	}
	fmt.Fprintln(env.Stdout, d.kind)
	return 0
}

// noArgs refuses positional arguments where a workload takes none.
func noArgs(args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected argument %q (flags are --name VALUE)", args[0])
	}
	return nil
}

// lockedWriter is w written by one goroutine at a time.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
