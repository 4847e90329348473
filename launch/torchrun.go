package launch

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/meshrun/meshrun/logview"
)

// torchrun compatibility: the flags torchrun takes (in both its spellings,
// --nproc_per_node and --nproc-per-node), the variables it sets on every
// worker, and Python scripts run the way it runs them. docs/launcher.md has
// the table of every flag and variable.

// TorchErrorFile is where a rank's torch.distributed.elastic @record writes
// its error (TORCHELASTIC_ERROR_FILE), in the rank's folder; the launcher
// reads it for the root cause when the rank wrote no error.json of its own.
const TorchErrorFile = "torch_error.json"

// EnvPython names the Python interpreter for .py scripts and -m modules
// (--python; default python3 on the PATH).
const EnvPython = "MESHRUN_PYTHON"

// torchrunFlags registers torchrun's flags that meshrun's own do not already
// cover, on fs.
func (o *RunOptions) torchrunFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.MaxRestarts, "max-restarts", 0, "restarts after a failure")
	fs.StringVar(&o.MasterAddr, "master-addr", "", "MASTER_ADDR")
	fs.IntVar(&o.MasterPort, "master-port", 0, "MASTER_PORT")
	fs.BoolVar(&o.Standalone, "standalone", false, "one node, embedded rendezvous")
	fs.StringVar(&o.RdzvEndpoint, "rdzv-endpoint", "", "NATS server host:port")
	fs.StringVar(&o.RdzvID, "rdzv-id", "", "job id")
	fs.StringVar(&o.RdzvBackend, "rdzv-backend", "", "static, c10d or nats: all mean meshrun's NATS rendezvous")
	fs.StringVar(&o.RdzvConf, "rdzv-conf", "", "key=value,...")
	fs.StringVar(&o.Role, "role", "", "ROLE_NAME")
	fs.StringVar(&o.Redirects, "redirects", "", "streams kept off the console")
	fs.StringVar(&o.Redirects, "r", "", "short for --redirects")
	fs.StringVar(&o.Tee, "tee", "", "streams on the console and in the logs")
	fs.StringVar(&o.Tee, "t", "", "short for --tee")
	fs.StringVar(&o.LocalRanksFilter, "local-ranks-filter", "", "local ranks shown on the console")
	fs.StringVar(&o.LocalAddr, "local-addr", "", "address this node's ranks announce")
	fs.BoolVar(&o.Module, "module", false, "run a Python module (python -m)")
	fs.BoolVar(&o.Module, "m", false, "short for --module")
	fs.BoolVar(&o.NoPython, "no-python", false, "run the script as a program")
	fs.BoolVar(&o.RunPath, "run-path", false, "run the script with python")
	fs.StringVar(&o.Python, "python", "", "Python interpreter")
	fs.Float64Var(&o.MonitorInterval, "monitor-interval", 0, "ignored: exits are seen at once")
	fs.StringVar(&o.StartMethod, "start-method", "", "ignored: every rank is a new process")
	fs.StringVar(&o.LogsSpecs, "logs-specs", "", "refused: a Python class")
}

// underscoreAliases gives every flag of fs spelled with '-' its torchrun
// spelling with '_' (--nproc_per_node), sharing the same value.
func underscoreAliases(fs *flag.FlagSet) {
	var alias []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if strings.Contains(f.Name, "-") {
			alias = append(alias, f)
		}
	})
	for _, f := range alias {
		fs.Var(f.Value, strings.ReplaceAll(f.Name, "-", "_"), f.Usage)
	}
}

// nnodesValue reads --nnodes: N, or torchrun's MIN:MAX with MIN = MAX.
type nnodesValue struct{ n *int }

func (v nnodesValue) String() string {
	if v.n == nil {
		return "1"
	}
	return strconv.Itoa(*v.n)
}

func (v nnodesValue) Set(s string) error {
	lo, hi, ranged := strings.Cut(s, ":")
	a, err := strconv.Atoi(lo)
	if err != nil {
		return fmt.Errorf("want a number of nodes, N or N:N")
	}
	if ranged {
		b, err := strconv.Atoi(hi)
		if err != nil {
			return fmt.Errorf("want a number of nodes, N or N:N")
		}
		if a != b {
			return fmt.Errorf("%s is an elastic range: meshrun starts a fixed number of nodes; give --nnodes %d (or %d:%d)", s, b, b, b)
		}
	}
	if a < 1 {
		return fmt.Errorf("want 1 or more nodes")
	}
	*v.n = a
	return nil
}

// applyTorchrun maps torchrun's rendezvous flags onto meshrun's: the
// rendezvous endpoint is the NATS server, the rendezvous id the job id;
// --standalone is one node with the embedded server; --nproc-per-node auto is
// gpu where GPUs are visible, else cpu.
func (o *RunOptions) applyTorchrun() error {
	if o.RdzvEndpoint != "" {
		u := o.RdzvEndpoint
		if !strings.Contains(u, "://") {
			u = "nats://" + u
		}
		if o.NATS != "" && o.NATS != u {
			return fmt.Errorf("--rdzv-endpoint %s and --nats %s: give one (the rendezvous endpoint is the NATS server)", o.RdzvEndpoint, o.NATS)
		}
		o.NATS = u
	}
	if o.RdzvID != "" {
		if o.JobID != "" && o.JobID != o.RdzvID {
			return fmt.Errorf("--rdzv-id %s and --job-id %s: give one (the rendezvous id is the job id)", o.RdzvID, o.JobID)
		}
		o.JobID = o.RdzvID
	}
	if o.NprocPerNode == "auto" {
		o.NprocPerNode = "cpu"
		if launcherCUDA {
			if n, err := gpuCount(); err == nil && n > 0 {
				o.NprocPerNode = "gpu"
			}
		}
	}
	return nil
}

// torchrunProblems are the problems of the torchrun flags.
func (o RunOptions) torchrunProblems() []string {
	var p []string
	if o.MaxRestarts < 0 {
		p = append(p, fmt.Sprintf("--max-restarts %d: must not be negative", o.MaxRestarts))
	}
	if o.MasterPort < 0 || o.MasterPort > 65535 {
		p = append(p, fmt.Sprintf("--master-port %d: want 1 to 65535", o.MasterPort))
	}
	if o.Standalone && (o.NNodes > 1 || o.NATS != "") {
		p = append(p, "--standalone runs one node with the embedded NATS server: it contradicts --nnodes > 1, --nats and --rdzv-endpoint")
	}
	switch o.RdzvBackend {
	case "", "static", "c10d", "nats":
	default:
		p = append(p, fmt.Sprintf("--rdzv-backend %s: meshrun's rendezvous runs over NATS (give its server as --rdzv-endpoint or --nats); static, c10d and nats are accepted and mean it", o.RdzvBackend))
	}
	if _, err := o.rendezvousTimeout(); err != nil {
		p = append(p, err.Error())
	}
	for _, f := range []struct{ name, v string }{{"--redirects", o.Redirects}, {"--tee", o.Tee}} {
		if _, err := parseStdSpec(f.v); err != nil {
			p = append(p, fmt.Sprintf("%s %q: %v", f.name, f.v, err))
		}
	}
	if o.LocalRanksFilter != "" {
		if _, err := ParseRanks(o.LocalRanksFilter); err != nil {
			p = append(p, fmt.Sprintf("--local-ranks-filter: %v; want local ranks like 0,2-3", err))
		}
		if o.Console != "" && o.Console != "all" {
			p = append(p, "--local-ranks-filter and --console both choose the ranks on the console: give one")
		}
	}
	n := 0
	for _, b := range []bool{o.Module, o.NoPython, o.RunPath} {
		if b {
			n++
		}
	}
	if n > 1 {
		p = append(p, "--module, --no-python and --run-path exclude one another")
	}
	if o.Program && (o.Module || o.RunPath) {
		p = append(p, "--module and --run-path run Python: not with a program after --")
	}
	if o.python() && len(o.Command) > 0 {
		if _, err := exec.LookPath(o.pythonPath()); err != nil {
			p = append(p, fmt.Sprintf("%s runs with %s, which is not found (%v); give --python PATH or set %s",
				o.Command[0], o.pythonPath(), err, EnvPython))
		}
	}
	switch o.StartMethod {
	case "", "spawn", "fork", "forkserver":
	default:
		p = append(p, fmt.Sprintf("--start-method %s: want spawn, fork or forkserver (every rank is a new process anyway)", o.StartMethod))
	}
	if o.MonitorInterval < 0 {
		p = append(p, "--monitor-interval: must not be negative")
	}
	if o.LogsSpecs != "" {
		p = append(p, "--logs-specs names a Python class of torchrun's; meshrun writes every rank's stdout and stderr to runs/<job>/rank-NNNNN/ (see --redirects, --tee, --console)")
	}
	return p
}

// python reports whether the command is Python run the way torchrun runs it:
// a .py script (not after --, not with --no-python), --run-path, or a module.
func (o RunOptions) python() bool {
	if o.Program || o.NoPython || len(o.Command) == 0 {
		return false
	}
	return o.Module || o.RunPath || strings.HasSuffix(o.Command[0], ".py")
}

func (o RunOptions) pythonPath() string {
	if o.Python != "" {
		return o.Python
	}
	return "python3"
}

// command is what every rank executes: Python with -u (unbuffered, as
// torchrun runs it) for a script or module, the program as given after -- or
// with --no-python; workload is true for a worker workload.
func (o RunOptions) command() (path string, args []string, workload bool) {
	switch {
	case o.python() && o.Module:
		return o.pythonPath(), append([]string{"-u", "-m"}, o.Command...), false
	case o.python():
		return o.pythonPath(), append([]string{"-u"}, o.Command...), false
	case o.Program || o.NoPython:
		return o.Command[0], o.Command[1:], false
	}
	return "", o.Command, true
}

// rendezvousTimeout is --rdzv-conf's join_timeout (seconds, as torchrun's):
// the ranks' rendezvous deadline; 0 when not given.
func (o RunOptions) rendezvousTimeout() (time.Duration, error) {
	if o.RdzvConf == "" {
		return 0, nil
	}
	var d time.Duration
	for _, kv := range strings.Split(o.RdzvConf, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return 0, fmt.Errorf("--rdzv-conf %q: want key=value,...", o.RdzvConf)
		}
		switch k {
		case "join_timeout", "timeout":
			s, err := strconv.ParseFloat(v, 64)
			if err != nil || s <= 0 {
				return 0, fmt.Errorf("--rdzv-conf %s=%s: want seconds", k, v)
			}
			d = time.Duration(s * float64(time.Second))
		case "read_timeout", "last_call_timeout", "close_timeout", "is_host", "keep_alive_interval",
			"keep_alive_max_attempt", "use_libuv", "heartbeat_timeout", "store_type":
			// torchrun's c10d store settings: meshrun has no such store.
		default:
			return 0, fmt.Errorf("--rdzv-conf: unknown key %q (meshrun reads join_timeout; torchrun's store settings are accepted and unused)", k)
		}
	}
	return d, nil
}

// parseStdSpec reads torchrun's --redirects/--tee value: 0 none, 1 stdout, 2
// stderr, 3 both, for every local rank ("3") or per local rank ("0:1,1:3").
// The result maps a local rank (-1: every one) to its streams.
func parseStdSpec(s string) (map[int]int, error) {
	out := map[int]int{}
	if s == "" {
		return out, nil
	}
	bits := func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 3 {
			return 0, fmt.Errorf("want 0 (none), 1 (stdout), 2 (stderr) or 3 (both), per local rank as 0:1,1:2")
		}
		return n, nil
	}
	if !strings.Contains(s, ":") {
		n, err := bits(s)
		out[-1] = n
		return out, err
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, ":")
		r, err := strconv.Atoi(k)
		if !ok || err != nil || r < 0 {
			return nil, fmt.Errorf("want LOCAL_RANK:STREAMS pairs like 0:1,1:2")
		}
		if out[r], err = bits(v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// shown reports whether stream (1 stdout, 2 stderr) of global rank r goes to
// the console: always to its log file; to the console too unless
// --redirects keeps it off and --tee does not put it back.
func (j *job) shown(r, stream int) bool {
	local := r - j.NodeRank*len(j.ranks)
	redirect, _ := parseStdSpec(j.Redirects)
	tee, _ := parseStdSpec(j.Tee)
	of := func(m map[int]int) int {
		if v, ok := m[local]; ok {
			return v
		}
		return m[-1]
	}
	return of(redirect)&stream == 0 || of(tee)&stream != 0
}

// torchEnv is what torchrun sets that is the same on every rank of the node
// (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and the per-attempt
// MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RESTART_COUNT are set
// elsewhere).
func (j *job) torchEnv() map[string]string {
	role := j.Role
	if role == "" {
		role = "default"
	}
	m := map[string]string{
		"GROUP_RANK":                   strconv.Itoa(j.NodeRank),
		"GROUP_WORLD_SIZE":             strconv.Itoa(j.nnodes),
		"ROLE_NAME":                    role,
		"ROLE_WORLD_SIZE":              strconv.Itoa(j.world),
		"TORCHELASTIC_RUN_ID":          j.id,
		"TORCHELASTIC_MAX_RESTARTS":    strconv.Itoa(j.MaxRestarts),
		"TORCHELASTIC_USE_AGENT_STORE": "False", // rank 0 hosts the TCPStore at MASTER_PORT
	}
	if _, ok := os.LookupEnv("TORCH_NCCL_ASYNC_ERROR_HANDLING"); !ok {
		m["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
	}
	if j.LocalAddr != "" {
		m["MESHRUN_TCP_HOST"] = j.LocalAddr
	}
	if d, _ := j.rendezvousTimeout(); d > 0 {
		m["MESHRUN_RENDEZVOUS_TIMEOUT"] = d.String()
	}
	return m
}

// torchRankEnv is what torchrun sets per rank: ROLE_RANK, the error file of
// @record, and OMP_NUM_THREADS (the rank's share of the cores, as its
// GOMAXPROCS; one the launcher inherited wins).
func (j *job) torchRankEnv(s rankSpec, dir string) []string {
	env := []string{"ROLE_RANK=" + strconv.Itoa(s.Rank), "TORCHELASTIC_ERROR_FILE=" + filepath.Join(dir, TorchErrorFile)}
	if _, ok := os.LookupEnv("OMP_NUM_THREADS"); !ok {
		env = append(env, "OMP_NUM_THREADS="+strconv.Itoa(s.GOMAXPROCS))
	}
	// PyTorch's flight recorder for NCCL jobs: the last collectives of each
	// rank, dumped into its folder when a collective times out (the user's
	// own settings win).
	for _, kv := range [][2]string{
		{"TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"},
		{"TORCH_NCCL_DUMP_ON_TIMEOUT", "1"},
		{"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", filepath.Join(dir, FlightRecorderPrefix)},
	} {
		if _, ok := os.LookupEnv(kv[0]); !ok {
			env = append(env, kv[0]+"="+kv[1])
		}
	}
	return env
}

// FlightRecorderPrefix starts the names of the flight recorder's dumps in a
// rank's folder (PyTorch appends the rank).
const FlightRecorderPrefix = logview.FlightRecorderPrefix

// torchError is the message of the error file a Python rank's @record wrote
// ({"message": {"message": ..., "extraInfo": ...}}), "" when none.
func torchError(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var f struct {
		Message json.RawMessage `json:"message"`
	}
	if json.Unmarshal(b, &f) != nil {
		return ""
	}
	var inner struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(f.Message, &inner) == nil && inner.Message != "" {
		return firstLine(inner.Message)
	}
	var s string
	if json.Unmarshal(f.Message, &s) == nil {
		return firstLine(s)
	}
	return ""
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}

// hostname is this machine's name, or 127.0.0.1 when it has none.
func hostname() string {
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return "127.0.0.1"
}
