package launch

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/meshrun/meshrun/internal/exitcode"
	"github.com/meshrun/meshrun/launch/cpulimit"
)

// Exit codes of `launcher run` that do not come from a rank.
const (
	// ExitTimeout is the exit code when --timeout ends the job (as timeout(1)).
	ExitTimeout = 124
	// ExitInterrupted is the exit code when the launcher is interrupted
	// (Ctrl-C or SIGTERM) before the ranks finished.
	ExitInterrupted = exitcode.Interrupted
	// ExitStartFailed is the exit code of a rank whose process could not start.
	ExitStartFailed = 127
)

// DefaultHangAfter is --hang-after's default: hang diagnosis is on unless
// turned off, and reports before a collective's own deadline (60 s) fails it.
const DefaultHangAfter = 30 * time.Second

// ErrRankFailed reports a job that ended because a rank failed; the error names
// the root-cause rank. Like every sentinel of this package (ErrInvalid,
// ErrJobTaken, ErrHang), its message starts with "launch: " and a call site
// wraps it first, adding no prefix of its own.
var ErrRankFailed = errors.New("launch: rank failed")

// ErrInvalid reports options that cannot be run; Validate wraps it. It is not
// placement.ErrInvalid nor collective.ErrInvalid: it means exit code 2
// (ExitUsage), whatever check found the problem.
var ErrInvalid = errors.New("launch: invalid options")

// Environment variables the launcher sets on every rank: the resolved --device
// and, when given, --kernels (the worker's defaults; a workload's own --device
// and --kernels flags win over them). They mirror the names the kernels
// providers' catalog reads (launch links no provider).
const (
	EnvDevice  = "MESHRUN_DEVICE"
	EnvKernels = "MESHRUN_KERNELS"
	EnvDType   = "MESHRUN_DTYPE"
)

// rankSpec is one rank of the job as the launcher starts it.
type rankSpec struct {
	Rank, LocalRank, Node int
	GOMAXPROCS            int
	// Device is the rank's device: cpu, sim or cuda.
	Device string
	// GPU is the CUDA_VISIBLE_DEVICES of a cuda rank, "" otherwise.
	GPU string
}

// job is validated options with every default filled in.
type job struct {
	RunOptions
	id     string
	dir    string
	ranks  []rankSpec
	path   string   // program to execute
	args   []string // its arguments
	nnodes int
	world  int    // ranks on every node
	device string // the ranks' device: cpu, sim or cuda
	// tag marks this launcher's ranks and all they start (guard.go); guard
	// kills them if the launcher dies.
	tag   string
	guard *guard
	// perms are the modes of the job's folders and files (--share-logs).
	perms logPerms
	// cpu holds the ranks' cgroups under --cpus-per-rank, nil without.
	cpu *cpulimit.Limit
}

// resolve fills in defaults: job id, worker path, rank table.
func (o RunOptions) resolve() (*job, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	j := &job{RunOptions: o, nnodes: max(o.NNodes, 1), tag: uuid.NewString()}
	j.id = o.JobID
	if j.id == "" {
		u, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("job id: %w", err)
		}
		j.id = u.String()
	}
	if j.LogDir == "" {
		j.LogDir = "runs"
	}
	j.dir = filepath.Join(j.LogDir, j.id)
	j.perms, _ = o.logPerms() // Validate refused a bad group
	n, _ := o.nproc()
	procs := cores() / n
	if o.CPUsPerRank > 0 {
		procs = int(math.Ceil(o.CPUsPerRank))
	}
	if procs < 1 {
		procs = 1
	}
	j.world = n * j.nnodes
	j.device, _ = o.rankDevice()
	var gpus []string
	if j.device == "cuda" {
		// One GPU per rank, drawn from what this launcher may use; with
		// --share-gpus, round-robin (Validate refused more ranks than GPUs
		// otherwise).
		gpus, _, _, _ = visibleGPUs()
	}
	for l := 0; l < n; l++ {
		s := rankSpec{Rank: o.NodeRank*n + l, LocalRank: l, Node: o.NodeRank, GOMAXPROCS: procs, Device: j.device}
		if j.device == "cuda" {
			s.GPU = strconv.Itoa(l)
			if len(gpus) > 0 {
				s.GPU = gpus[l%len(gpus)]
			}
		}
		j.ranks = append(j.ranks, s)
	}
	path, args, workload := o.command()
	if !o.Oversubscribe {
		if p := resourceProblems(n, workload, readHostLimits()); len(p) > 0 {
			return nil, problems{fmt.Sprintf("--nproc-per-node %d: %s; --oversubscribe runs it anyway", n, strings.Join(p, "; "))}
		}
	}
	if workload {
		w, err := o.workerPath()
		if err != nil {
			return nil, err
		}
		path = w
	}
	j.path, j.args = path, args
	return j, nil
}

// workerPath finds the worker binary: --worker (or MESHRUN_WORKER), else
// "worker" next to the launcher's executable.
func (o RunOptions) workerPath() (string, error) {
	if o.Worker != "" {
		return o.Worker, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("cannot find the worker: %v; pass --worker PATH", err)
	}
	w := filepath.Join(filepath.Dir(exe), "worker")
	if _, err := os.Stat(w); err != nil {
		return "", fmt.Errorf("no worker binary at %s; pass --worker PATH or set %s", w, EnvName("worker"))
	}
	return w, nil
}

// printTable writes the rank table of a dry run.
func (j *job) printTable(w io.Writer) {
	kern := j.Kernels
	if kern == "" {
		kern = "the device's own"
	}
	capped := ""
	if j.CPUsPerRank > 0 {
		capped = fmt.Sprintf(", each capped at %v cores", j.CPUsPerRank)
	}
	fmt.Fprintf(w, "job %s: node %d of %d, %d of %d ranks here%s, device %s, kernels %s, logs in %s\n",
		j.id, j.NodeRank, j.nnodes, len(j.ranks), j.world, capped, j.device, kern, j.dir)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tRANK\tLOCAL_RANK\tGOMAXPROCS\tDEVICE\tGPU\tCOMMAND")
	cmd := strings.Join(append([]string{j.path}, j.args...), " ")
	for _, r := range j.ranks {
		gpu := r.GPU
		if gpu == "" {
			gpu = "-"
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\t%s\t%s\n", r.Node, r.Rank, r.LocalRank, r.GOMAXPROCS, r.Device, gpu, cmd)
	}
	tw.Flush()
}

// Run runs the job and returns the launcher's exit code: 0 when every rank
// exited 0, else the root-cause rank's code (128+signal if it was signalled),
// ExitTimeout after --timeout, ExitInterrupted when ctx was cancelled. err
// explains a non-zero code; it wraps ErrRankFailed when a rank failed and
// ErrInvalid for options that cannot run.
func (o RunOptions) Run(ctx context.Context) (int, error) {
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	j, err := o.resolve()
	if err == nil {
		err = j.checkWorkload()
	}
	if err != nil {
		if !o.DryRun {
			o.tellCannotStart(err)
		}
		return ExitUsage, err
	}
	if j.DryRun {
		j.printTable(j.Stdout)
		return 0, nil
	}
	code, err := j.run(ctx)
	if cs := (cannotStart{}); errors.As(err, &cs) {
		o.tellCannotStart(cs.error)
		err = cs.error
	}
	return code, err
}

// runMain is `launcher run`.
func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := ParseRunFlags(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, runUsage)
		return 0
	}
	if err == nil {
		if err = o.Validate(); err != nil && !o.DryRun {
			o.tellCannotStart(err)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "launcher run: %v\n", err)
		return ExitUsage
	}
	o.Argv = append([]string{"launcher", "run"}, args...)
	o.Stdout, o.Stderr = stdout, stderr
	code, err := o.Run(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "launcher run: %v\n", err)
	}
	return code
}
