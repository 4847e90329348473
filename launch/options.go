package launch

import (
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"
)

// The flags of `launcher run`: its usage, RunOptions, and their parsing from
// the command line and MESHRUN_<FLAG> (torchrun's spellings: torchrun.go).

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
  --cpus-per-rank X            cap each rank at X cores (e.g. 0.5), so that it runs at one speed
                               whether its neighbours compute or wait: a whole number of cores
                               by pinning each rank to cores of its own; a fraction through a
                               cpu cgroup of its own, so that ranks of a machine with fewer
                               cores than ranks behave as on one core each, slower (Linux; the
                               launcher must be allowed to make cgroups, usually as root);
                               GOMAXPROCS is X rounded up
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
                               0 turns it off); for a program (a PyTorch script), the time
                               no rank makes progress (output, or 5% of a core) before its
                               stacks are dumped and the odd rank out named (default 10m)
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
	// CPUsPerRank caps each rank's processes at this many cores through a
	// cpu cgroup per rank (cgroup_linux.go); 0 leaves them uncapped.
	CPUsPerRank float64
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
	// HangAfterSet: --hang-after (or its variable) was given. A program's
	// job (not meshrun's workers) is judged idle after HangAfter only then,
	// else after DefaultProgramHangAfter.
	HangAfterSet bool
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
var runFlagNames = []string{"nproc-per-node", "device", "kernels", "dtype", "share-gpus", "oversubscribe", "cpus-per-rank", "nnodes", "node-rank", "nats", "nats-creds", "nats-ca",
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
	fs.Visit(func(f *flag.Flag) { o.HangAfterSet = o.HangAfterSet || f.Name == "hang-after" })
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
	fs.Float64Var(&o.CPUsPerRank, "cpus-per-rank", 0, "cap each rank at this many cores")
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
