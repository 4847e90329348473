package launch

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/meshrun/meshrun/natsconn"
	"github.com/meshrun/meshrun/runlog"
)

// Exit codes of `launcher run` that do not come from a rank.
const (
	// ExitTimeout is the exit code when --timeout ends the job (as timeout(1)).
	ExitTimeout = 124
	// ExitInterrupted is the exit code when the launcher is interrupted
	// (Ctrl-C or SIGTERM) before the ranks finished.
	ExitInterrupted = 130
	// ExitStartFailed is the exit code of a rank whose process could not start.
	ExitStartFailed = 127
)

// DefaultHangAfter is --hang-after's default: hang diagnosis is on unless
// turned off, and reports before a collective's own deadline (60 s) fails it.
const DefaultHangAfter = 30 * time.Second

// ErrRankFailed reports a job that ended because a rank failed; the error names
// the root-cause rank.
var ErrRankFailed = errors.New("rank failed")

// ErrInvalid reports options that cannot be run; Validate wraps it.
var ErrInvalid = errors.New("invalid options")

// Environment variables the launcher sets on every rank: the resolved --device
// and, when given, --kernels (the worker's defaults; a workload's own --device
// and --kernels flags win over them). They mirror the names the kernels
// providers' catalog reads (launch links no provider).
const (
	EnvDevice  = "MESHRUN_DEVICE"
	EnvKernels = "MESHRUN_KERNELS"
	EnvDType   = "MESHRUN_DTYPE"
)

const runUsage = `usage: launcher run [flags] WORKLOAD [ARGS...]     runs "worker WORKLOAD ARGS" on every rank
       launcher run [flags] -- PROGRAM [ARGS...]      runs any program on every rank
       launcher run [flags] SCRIPT.py [ARGS...]       runs "python3 -u SCRIPT.py ARGS" (as torchrun)
       launcher run [flags] -m MODULE [ARGS...]       runs "python3 -u -m MODULE ARGS"

flags (each also read from MESHRUN_<FLAG>, e.g. MESHRUN_NPROC_PER_NODE=4):
  -n, --nproc-per-node N|cpu|gpu  ranks on this machine (cpu: one per core this launcher may
                               use; gpu: one per GPU, cuda builds only, implies --device cuda)
  --device cpu|sim|cuda        the ranks' device, passed to them as MESHRUN_DEVICE (default:
                               the --kernels provider's device, else cpu); cuda: one GPU per
                               rank through CUDA_VISIBLE_DEVICES; sim: simulated device memory
  --kernels SPEC               kernel providers, passed as MESHRUN_KERNELS: cpu, sim, cuda,
                               openblas, or per op, e.g. cpu,gemm=openblas (default: the
                               device's own)
  --dtype float32|bfloat16     the ranks' compute dtype, passed as MESHRUN_DTYPE; refused when
                               a kernels provider lacks it (default: the workload's, float32)
  --share-gpus                 with --device cuda, let more ranks than visible GPUs share
                               them, round-robin (refused otherwise)
  --oversubscribe              start more ranks than the machine holds: over 64 per core, its
                               open-file or process limit, or 20 MiB per worker rank of its
                               available memory (refused otherwise, naming the limit)
  --nnodes N                   machines in the job, one launcher each (default 1)
  --node-rank K                this machine's index, 0..N-1; RANK = K*nproc + LOCAL_RANK
  --nats URL[,URL]             an external NATS for several machines (default: embedded,
                               127.0.0.1, random port); needs --nats-creds and --job-id
  --nats-creds FILE            0600 credentials file of the job's NATS user (with --nats)
  --nats-ca FILE               CA that signed the NATS server's certificate (turns TLS on)
  --nats-cert FILE, --nats-key FILE
                               a client certificate for NATS servers that verify clients
  --insecure                   allow plaintext NATS to a non-loopback address (refused
                               otherwise: use tls:// and --nats-ca)
  --job-id ID                  job id (default a new UUIDv7)
  --log-dir DIR                where runs/<job-id>/ goes (default ./runs); the job's folders
                               are 0700 and its files 0600, whatever the umask
  --share-logs GROUP           give the job's folders and files to GROUP, which may read them
                               (folders 0750, files 0640; refused for a group you are not in)
  --console all|none|RANKS     ranks shown on the console, e.g. 0,4-7 (default all)
  --grace DUR                  time between SIGTERM and SIGKILL on teardown (default 10s)
  --timeout DUR                end the job after DUR, exit 124 (default none)
  --hang-after DUR             name the ranks missing from a collective the others have
                               waited in for DUR, dump every rank's stacks, and end the job
                               with the missing rank as root cause, exit 125 (default 30s;
                               0 turns it off)
  --trace-max SIZE             bound each rank's trace on disk, keeping the newest spans,
                               e.g. 64M, 0 for none (default 32M; MESHRUN_TRACE_MAX)
  --worker PATH                worker binary (default: "worker" next to the launcher)
  --dry-run                    print the rank table and exit
  --max-restarts N             after a rank fails or hangs, restart every rank, up to N times
                               (TORCHELASTIC_RESTART_COUNT; logs of attempt K in attempt-K/)
  --python PATH                interpreter of .py scripts and -m modules (default python3)

torchrun's flags, in both spellings (--nproc_per_node or --nproc-per-node; docs/launcher.md):
  --standalone                 one node, the embedded NATS server (the default)
  --rdzv-endpoint HOST:PORT    the NATS server (as --nats nats://HOST:PORT)
  --rdzv-id ID                 the job id (as --job-id)
  --rdzv-backend static|c10d|nats   accepted: the rendezvous runs over NATS
  --rdzv-conf join_timeout=S   the ranks' rendezvous deadline
  --master-addr ADDR, --master-port PORT
                               MASTER_ADDR and MASTER_PORT (default: 127.0.0.1 on one node, node
                               0's host name on several, and a free port, new each attempt)
  --role NAME                  ROLE_NAME (default "default")
  -r, --redirects 0|1|2|3|LR:N,...   streams (1 stdout, 2 stderr, 3 both) kept off the console
  -t, --tee 0|1|2|3|LR:N,...   streams on the console as well as in the logs (the default)
  --local-ranks-filter RANKS   local ranks shown on the console
  --local-addr ADDR            the address this node's ranks announce
  -m, --module                 run a Python module; --no-python runs the script as a program;
                               --run-path runs it with python (what a .py gets anyway)
  --monitor-interval S, --start-method M   accepted, unused; --logs-specs refused
`

// RunOptions are the flags of `launcher run`. The zero value of every field but
// Command means its default.
type RunOptions struct {
	// NprocPerNode is "N", "cpu" or "gpu"; default 1.
	NprocPerNode string
	// Device is the ranks' device: "cpu", "sim" or "cuda" (one GPU per
	// rank). Empty means the Kernels provider's device, cuda with
	// NprocPerNode "gpu", else cpu.
	Device string
	// Kernels is the kernels provider choice (kernels.ParseChoice), checked
	// against the providers compiled into this binary; empty means the
	// device's own provider.
	Kernels string
	// DType is the ranks' compute dtype ("float32" or "bfloat16"; empty: the
	// workload's default), passed as MESHRUN_DTYPE and checked against the
	// kernels providers before any rank starts.
	DType string
	// ShareGPUs lets more cuda ranks than visible GPUs share them
	// round-robin; without it that is refused.
	ShareGPUs bool
	// Oversubscribe starts more ranks than this machine's cores, open-file
	// and process limits or memory allow (refused otherwise; resources.go).
	Oversubscribe bool
	// NNodes is the number of launchers in the job (default 1); NodeRank is
	// this one's index.
	NNodes, NodeRank int
	// NATS is an external server's URL (required with NNodes > 1); empty
	// starts an embedded server on loopback. NATSCreds is the job user's
	// credentials file for it.
	NATS, NATSCreds string
	// NATSCA, NATSCert and NATSKey are TLS files for the external server;
	// Insecure allows plaintext to a non-loopback address.
	NATSCA, NATSCert, NATSKey string
	Insecure                  bool
	// Console is "all" (default), "none" or a rank list like "0,4-7".
	Console string
	// HangAfter enables hang diagnosis: a collective waited in for this long
	// names its missing ranks; 0 disables it. ParseRunFlags defaults it to
	// DefaultHangAfter.
	HangAfter time.Duration
	// TraceMax bounds each rank's trace files on disk (runlog.EnvTraceMax);
	// "" leaves runlog's default, 32 MiB.
	TraceMax string
	// JobID names the job: letters, digits, '-' and '_'; default a UUIDv7.
	JobID string
	// LogDir holds one folder per job; default "runs".
	LogDir string
	// ShareLogs is a group (name or id) the job's folder is given to, with
	// read access; empty: the folder is the user's alone (perm.go).
	ShareLogs string
	// Grace is the time between SIGTERM and SIGKILL on teardown; default 10 s.
	Grace time.Duration
	// Timeout ends the job after this long (exit 124); 0 means none.
	Timeout time.Duration
	// Worker is the worker binary for workloads; default "worker" next to the
	// launcher's executable.
	Worker string
	// DryRun prints the rank table and starts nothing.
	DryRun bool

	// MaxRestarts restarts every rank up to this many times after a rank
	// fails or hangs (TORCHELASTIC_RESTART_COUNT counts the attempts).
	MaxRestarts int
	// MasterAddr and MasterPort are the ranks' MASTER_ADDR and MASTER_PORT
	// (torch's env:// rendezvous); empty and 0 choose them per attempt.
	MasterAddr string
	MasterPort int
	// Standalone is torchrun's --standalone: one node, the embedded server.
	Standalone bool
	// RdzvEndpoint (the NATS server), RdzvID (the job id), RdzvBackend and
	// RdzvConf are torchrun's rendezvous flags, mapped onto NATS and the job
	// id by ParseRunFlags.
	RdzvEndpoint, RdzvID, RdzvBackend, RdzvConf string
	// Role is ROLE_NAME (default "default").
	Role string
	// Redirects and Tee are torchrun's stream choices per local rank (0
	// none, 1 stdout, 2 stderr, 3 both, or "0:1,1:2"): redirected streams
	// stay off the console (they are always in the logs); tee puts them back.
	Redirects, Tee string
	// LocalRanksFilter shows only these local ranks on the console.
	LocalRanksFilter string
	// LocalAddr is the address this node's ranks announce to their peers.
	LocalAddr string
	// Module runs Command[0] as a Python module, RunPath as a Python
	// script; NoPython runs a .py script as a program. Python is the
	// interpreter (default python3).
	Module, NoPython, RunPath bool
	Python                    string
	// MonitorInterval and StartMethod are accepted for torchrun's command
	// lines and unused; LogsSpecs is refused.
	MonitorInterval float64
	StartMethod     string
	LogsSpecs       string
	// Program is true when Command is a program to run as is (after "--"),
	// false when Command[0] is a worker workload.
	Program bool
	// Command is the workload and its arguments, or the program and its arguments.
	Command []string
	// Argv is the launcher's command line, recorded in job.json.
	Argv []string

	// Stdout and Stderr receive the ranks' prefixed output and the launcher's
	// notices; nil discards.
	Stdout, Stderr io.Writer
}

var jobIDRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// runFlagNames are the flags that may also come from MESHRUN_<FLAG>.
var runFlagNames = []string{"nproc-per-node", "device", "kernels", "dtype", "share-gpus", "oversubscribe", "nnodes", "node-rank", "nats", "nats-creds", "nats-ca",
	"nats-cert", "nats-key", "insecure", "job-id", "log-dir", "share-logs",
	"console", "grace", "timeout", "hang-after", "trace-max", "worker", "dry-run",
	"max-restarts", "master-addr", "master-port", "rdzv-endpoint", "rdzv-id", "rdzv-backend", "rdzv-conf", "role",
	"redirects", "tee", "local-ranks-filter", "local-addr", "python"}

// EnvName is the environment variable that sets a `launcher run` flag.
func EnvName(flagName string) string {
	return "MESHRUN_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// ParseRunFlags reads `launcher run` flags; getenv supplies MESHRUN_<FLAG>
// defaults (flags on the command line win). Errors are usage errors.
func ParseRunFlags(args []string, getenv func(string) string) (RunOptions, error) {
	o := RunOptions{NprocPerNode: "1", LogDir: "runs", Grace: 10 * time.Second, NNodes: 1, Console: "all",
		HangAfter: DefaultHangAfter}
	fs := o.flagSet()
	if getenv != nil {
		for _, n := range runFlagNames {
			v := getenv(EnvName(n))
			if v == "" {
				continue
			}
			if err := fs.Set(n, v); err != nil {
				return o, fmt.Errorf("%s=%q: %v", EnvName(n), v, err)
			}
		}
	}
	if err := fs.Parse(args); err != nil {
		return o, err // flag.ErrHelp for -h
	}
	rest := fs.Args()
	consumed := len(args) - len(rest)
	o.Program = consumed > 0 && args[consumed-1] == "--"
	o.Command = rest
	return o, o.applyTorchrun()
}

// flagSet is `launcher run`'s flags, read into o.
func (o *RunOptions) flagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.NprocPerNode, "nproc-per-node", o.NprocPerNode, "ranks on this machine: N or cpu")
	fs.StringVar(&o.NprocPerNode, "n", o.NprocPerNode, "short for --nproc-per-node")
	fs.StringVar(&o.Device, "device", o.Device, "cpu, sim or cuda")
	fs.StringVar(&o.Kernels, "kernels", "", "kernels provider choice")
	fs.StringVar(&o.DType, "dtype", "", "compute dtype: float32 or bfloat16")
	fs.BoolVar(&o.ShareGPUs, "share-gpus", false, "let cuda ranks share GPUs")
	fs.BoolVar(&o.Oversubscribe, "oversubscribe", false, "start more ranks than the machine's limits allow")
	fs.Var(nnodesValue{&o.NNodes}, "nnodes", "machines")
	fs.IntVar(&o.NodeRank, "node-rank", 0, "this machine's index")
	fs.StringVar(&o.NATS, "nats", "", "external NATS URL")
	fs.StringVar(&o.NATSCreds, "nats-creds", "", "credentials file for --nats")
	fs.StringVar(&o.NATSCA, "nats-ca", "", "CA of the NATS server's certificate")
	fs.StringVar(&o.NATSCert, "nats-cert", "", "client certificate for NATS")
	fs.StringVar(&o.NATSKey, "nats-key", "", "client certificate key for NATS")
	fs.BoolVar(&o.Insecure, "insecure", false, "allow plaintext NATS to a non-loopback address")
	fs.StringVar(&o.Console, "console", o.Console, "all, none or ranks")
	fs.DurationVar(&o.HangAfter, "hang-after", o.HangAfter, "hang diagnosis threshold")
	fs.StringVar(&o.TraceMax, "trace-max", "", "bound of each rank's trace files")
	fs.StringVar(&o.JobID, "job-id", "", "job id (default a UUIDv7)")
	fs.StringVar(&o.LogDir, "log-dir", o.LogDir, "log directory")
	fs.StringVar(&o.ShareLogs, "share-logs", "", "group that may read the job's logs")
	fs.DurationVar(&o.Grace, "grace", o.Grace, "SIGTERM to SIGKILL")
	fs.DurationVar(&o.Timeout, "timeout", 0, "job timeout")
	fs.StringVar(&o.Worker, "worker", "", "worker binary")
	fs.BoolVar(&o.DryRun, "dry-run", false, "print the rank table and exit")
	o.torchrunFlags(fs)
	underscoreAliases(fs)
	return fs
}

// problems collects every problem Validate finds.
type problems []string

func (p problems) Error() string { return strings.Join(p, "; ") }
func (p problems) Unwrap() error { return ErrInvalid }

// Validate reports every problem with the options at once, in one line.
func (o RunOptions) Validate() error {
	var p problems
	dev, devErr := o.rankDevice()
	if devErr != nil {
		p = append(p, devErr.Error())
	}
	n, nerr := o.nproc()
	// -n gpu in a build without CUDA: the device check has named the build.
	if nerr != nil && !(o.NprocPerNode == "gpu" && o.deviceName() == "cuda" && devErr != nil && !launcherCUDA) {
		p = append(p, nerr.Error())
	}
	if nerr == nil && (dev == "cuda" || devErr != nil && o.deviceName() == "cuda") {
		if msg := o.gpuProblem(n); msg != "" {
			p = append(p, msg)
		}
	}
	if o.ShareGPUs && devErr == nil && dev != "cuda" {
		p = append(p, fmt.Sprintf("--share-gpus with --device %s: only cuda ranks have GPUs to share", dev))
	}
	if o.JobID != "" && !jobIDRE.MatchString(o.JobID) {
		p = append(p, fmt.Sprintf("--job-id %q: want 1 to 64 letters, digits, '-' or '_'", o.JobID))
	}
	if o.Grace < 0 {
		p = append(p, fmt.Sprintf("--grace %v: must not be negative", o.Grace))
	}
	if o.HangAfter < 0 {
		p = append(p, fmt.Sprintf("--hang-after %v: must not be negative", o.HangAfter))
	}
	if o.NNodes < 0 || o.NNodes > 1<<16 {
		p = append(p, fmt.Sprintf("--nnodes %d: want 1 to %d", o.NNodes, 1<<16))
	}
	if o.NodeRank < 0 || o.NodeRank >= max(o.NNodes, 1) {
		p = append(p, fmt.Sprintf("--node-rank %d: want 0 to %d", o.NodeRank, max(o.NNodes, 1)-1))
	}
	if o.NNodes > 1 && o.NATS == "" {
		p = append(p, "--nnodes > 1 needs --nats URL (the NATS server every launcher reaches)")
	}
	if o.NNodes > 1 && o.JobID == "" {
		p = append(p, "--nnodes > 1 needs --job-id (the same on every node)")
	}
	if o.NATS != "" && o.NATSCreds == "" {
		p = append(p, "--nats needs --nats-creds FILE (the job user's credentials, handed to the ranks)")
	}
	if o.NATS == "" && (o.NATSCreds != "" || o.NATSCA != "" || o.NATSCert != "" || o.NATSKey != "") {
		p = append(p, "--nats-creds/--nats-ca/--nats-cert/--nats-key without --nats: the embedded server makes its own")
	}
	if o.NATS != "" && o.NATSCreds != "" {
		if err := o.natsConfig().Validate(); err != nil {
			p = append(p, strings.TrimPrefix(err.Error(), natsconn.ErrConfig.Error()+": "))
		}
	}
	if _, err := o.consoleFilter(); err != nil {
		p = append(p, err.Error())
	}
	if o.TraceMax != "" {
		if _, err := runlog.ParseSize(o.TraceMax); err != nil {
			p = append(p, "--trace-max: "+strings.TrimPrefix(err.Error(), "bad size "))
		}
	}
	if o.Timeout < 0 {
		p = append(p, fmt.Sprintf("--timeout %v: must not be negative", o.Timeout))
	}
	if _, err := o.logPerms(); err != nil {
		p = append(p, err.Error())
	}
	p = append(p, o.torchrunProblems()...)
	if len(o.Command) == 0 {
		if o.Program {
			p = append(p, "no program after --")
		} else {
			p = append(p, "no workload: launcher run [flags] WORKLOAD [ARGS...] or -- PROGRAM [ARGS...]")
		}
	}
	if len(p) == 0 {
		return nil
	}
	return p
}

// natsConfig is the external NATS the flags name.
func (o RunOptions) natsConfig() natsconn.Config {
	return natsconn.Config{URL: o.NATS, CredsFile: o.NATSCreds, CA: o.NATSCA, Cert: o.NATSCert, Key: o.NATSKey, Insecure: o.Insecure}
}

// nproc resolves --nproc-per-node.
func (o RunOptions) nproc() (int, error) {
	s := o.NprocPerNode
	switch s {
	case "":
		return 1, nil
	case "cpu":
		return cores(), nil
	case "gpu":
		n, err := gpuCount()
		if err != nil {
			return 0, fmt.Errorf("--nproc-per-node gpu: %v", err)
		}
		if n < 1 {
			return 0, errors.New("--nproc-per-node gpu: no GPU visible")
		}
		return n, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("--nproc-per-node %q: want a positive number, cpu or gpu", s)
	}
	return n, nil
}

// consoleFilter resolves --console into which ranks the console shows.
func (o RunOptions) consoleFilter() (func(int) bool, error) {
	if o.LocalRanksFilter != "" {
		set, err := ParseRanks(o.LocalRanksFilter)
		if err != nil {
			return nil, err
		}
		n, _ := o.nproc()
		return func(r int) bool { return set[r-o.NodeRank*n] }, nil
	}
	switch o.Console {
	case "", "all":
		return func(int) bool { return true }, nil
	case "none":
		return func(int) bool { return false }, nil
	}
	set, err := ParseRanks(o.Console)
	if err != nil {
		return nil, fmt.Errorf("--console: %v; want all, none or ranks like 0,4-7", err)
	}
	return func(r int) bool { return set[r] }, nil
}

// cores is how many CPUs this launcher may use, shared out among its ranks:
// Go's GOMAXPROCS, which honours the CPU affinity mask and a cgroup CPU limit
// (a container's), or the launcher's own GOMAXPROCS variable when set.
func cores() int { return runtime.GOMAXPROCS(0) }

// deviceName is --device as given, with -n gpu implying cuda; empty when
// neither says (the kernels' device, else cpu).
func (o RunOptions) deviceName() string {
	if o.Device == "" && o.NprocPerNode == "gpu" {
		return "cuda"
	}
	return o.Device
}

// rankDevice resolves the ranks' device ("cpu", "sim" or "cuda") from
// --device, --kernels, --dtype and -n gpu, and refuses what this build cannot
// run (resolveDevice): a device or provider not compiled in (naming the build
// command), providers of another device, a dtype a provider lacks.
func (o RunOptions) rankDevice() (string, error) {
	if o.NprocPerNode == "gpu" && o.Device != "" && o.Device != "cuda" {
		return "", fmt.Errorf("--nproc-per-node gpu starts one rank per GPU: --device %s contradicts it; want --device cuda or a number of ranks", o.Device)
	}
	dev, err := resolveDevice(o)
	if err != nil {
		if o.Device == "" && o.NprocPerNode == "gpu" {
			err = fmt.Errorf("--nproc-per-node gpu implies %v", err)
		}
		return "", err
	}
	return dev, nil
}

// visibleGPUs are the GPUs the launcher may hand to its ranks: the entries of
// CUDA_VISIBLE_DEVICES when it is set (even empty), else every device the
// CUDA driver reports in a cuda build. known is false in a build without CUDA
// and no CUDA_VISIBLE_DEVICES: nothing to count (the build is refused anyway).
func visibleGPUs() (ids []string, from string, known bool, err error) {
	// A cuda build asks the driver first, whatever CUDA_VISIBLE_DEVICES says:
	// the ranks need it, and a machine without one is refused before any
	// rank starts, naming the library the loader could not open.
	n := 0
	if launcherCUDA {
		if n, err = gpuCount(); err != nil {
			return nil, "", false, err
		}
	}
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" {
				ids = append(ids, id)
			}
		}
		return ids, "CUDA_VISIBLE_DEVICES lists", true, nil
	}
	if !launcherCUDA {
		return nil, "", false, nil
	}
	for i := 0; i < n; i++ {
		ids = append(ids, strconv.Itoa(i))
	}
	return ids, "the CUDA driver reports", true, nil
}

// gpuProblem checks that n cuda ranks on this node have a GPU each, or may
// share them (--share-gpus); it returns the problem, "" when none.
func (o RunOptions) gpuProblem(n int) string {
	ids, from, known, err := visibleGPUs()
	switch {
	case err != nil:
		return fmt.Sprintf("--device cuda: %v", err)
	case !known:
		return ""
	case len(ids) == 0:
		return fmt.Sprintf("--device cuda: no GPU visible (%s none)", from)
	case n > len(ids) && !o.ShareGPUs:
		return fmt.Sprintf("--nproc-per-node %s with --device cuda needs %d GPUs, %s %d (%s); pass --share-gpus to let ranks share them",
			o.NprocPerNode, n, from, len(ids), strings.Join(ids, ","))
	}
	return ""
}

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
	fmt.Fprintf(w, "job %s: node %d of %d, %d of %d ranks here, device %s, kernels %s, logs in %s\n",
		j.id, j.NodeRank, j.nnodes, len(j.ranks), j.world, j.device, kern, j.dir)
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
