package launch

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/meshrun/meshrun/bootstrap/natsconn"
	"github.com/meshrun/meshrun/launch/cpulimit"
	"github.com/meshrun/meshrun/runlog"
)

// The checks of `launcher run`'s options before anything starts, and what
// they resolve: the number of ranks, the console's ranks, the ranks' device
// and GPUs.

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
	if o.CPUsPerRank != 0 {
		if msg := o.cpusPerRankProblem(n, nerr == nil); msg != "" {
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

// cpusPerRankProblem checks --cpus-per-rank: a number of cores from 0.01 up,
// n ranks of it (known: n was read) within this machine's cores unless
// --oversubscribe, and cgroups this launcher may make (unless whole cores).
func (o RunOptions) cpusPerRankProblem(n int, known bool) string {
	x := o.CPUsPerRank
	if math.IsNaN(x) || math.IsInf(x, 0) || x < 0.01 {
		return fmt.Sprintf("--cpus-per-rank %v: want a number of cores from 0.01 up, e.g. 0.5", x)
	}
	if c := cores(); known && !o.Oversubscribe && x*float64(n) > float64(c)+1e-9 {
		return fmt.Sprintf("--cpus-per-rank %v × %d ranks is %v cores, this launcher may use %d; --oversubscribe runs it anyway", x, n, x*float64(n), c)
	}
	return cpulimit.Problem(x)
}
