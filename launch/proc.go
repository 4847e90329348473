package launch

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/launch/probe"
	"github.com/meshrun/meshrun/logview"
	"github.com/meshrun/meshrun/runlog"
	"github.com/nats-io/nats-server/v2/server"
)

// waitDelay bounds how long a rank's output is still read after the rank
// exited, when a process it left behind holds its stdout or stderr open.
const waitDelay = 2 * time.Second

// proc is one started rank.
type proc struct {
	spec    rankSpec
	cmd     *exec.Cmd
	pid     int
	start   time.Time
	done    bool
	out     RankOutcome
	files   []*os.File
	flushes []io.Closer
	// stacks: the rank said (through runlog) that SIGUSR1 dumps its stacks.
	stacks atomic.Bool
	// crash watches its stderr for a Go runtime's crash report; crashed is
	// the report of a rank that exited so (onExit).
	crash   logview.CrashWatch
	crashed *logview.CrashReport
	// dir is its folder; runtime what its hello marker said it is ("python",
	// "go"); act its progress as the launcher sees it (foreign.go).
	dir      string
	runtime  atomic.Value
	helloPID atomic.Int64 // the process that dumps its stacks, when not the rank's own
	act      activity
}

// exitMsg reports a rank's end from its waiting goroutine.
type exitMsg struct {
	rank  int
	state *os.ProcessState
	err   error
	end   time.Time
}

func signalName(s syscall.Signal) string {
	if n, ok := logview.SignalNames[s]; ok {
		return n
	}
	return "signal " + strconv.Itoa(int(s))
}

// exitCode is a rank's exit code as a shell reports it: the status, or
// 128+signal when a signal ended it.
func exitCode(st *os.ProcessState) (code int, sig string) {
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok {
		return st.ExitCode(), ""
	}
	if ws.Signaled() {
		return 128 + int(ws.Signal()), signalName(ws.Signal())
	}
	return ws.ExitStatus(), ""
}

// versions are recorded in job.json.
func versions() map[string]string {
	v := map[string]string{
		"go":          runtime.Version(),
		"os_arch":     runtime.GOOS + "/" + runtime.GOARCH,
		"nats_server": server.VERSION,
		"meshrun":     "(unknown)",
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v["meshrun"] = bi.Main.Version
	}
	return v
}

// abortSettle is how long teardown waits between the abort broadcast and
// SIGTERM, so that peers blocked in a collective fail naming the root cause
// before they are signalled. It covers the collective layer's own wait for an
// earlier failure's notice when it sees a peer vanish (250 ms).
const abortSettle = 350 * time.Millisecond

// hangCheckEvery is how often --hang-after looks at the heartbeats.
const hangCheckEvery = 250 * time.Millisecond

// start starts one rank in its own process group, with its output going,
// stamped, to its log files and, prefixed, to the console.
func (j *job) start(p *proc, attemptDir string, common map[string]string, outCon, errCon *logview.Console, board *logview.ProgressBoard) error {
	dir, err := filepath.Abs(filepath.Join(attemptDir, RankDir(p.spec.Rank)))
	if err != nil {
		return err
	}
	if err := j.makeDir(dir); err != nil {
		return err
	}
	stdout, err := createFile(filepath.Join(dir, "stdout.log"))
	if err != nil {
		return err
	}
	p.files = append(p.files, stdout)
	stderr, err := createFile(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return err
	}
	p.files = append(p.files, stderr)
	rank := p.spec.Rank
	po := &logview.RankWriter{File: stdout, Con: outCon, Node: p.spec.Node, Rank: rank, OnMarker: func(kind string, body []byte) {
		switch kind {
		case "progress":
			board.Report(rank, body)
		case "hello":
			if h := probe.ReadHello(body); h.Runtime != "" {
				p.runtime.Store(h.Runtime)
				p.helloPID.Store(int64(h.PID))
				// The heartbeats' hang check signals the rank's own
				// process: a Go worker's.
				p.stacks.Store(h.Runtime == "go")
			}
		}
	}}
	po.OnLine = func(t time.Time) { p.act.line.Store(t.UnixNano()) }
	pe := &logview.RankWriter{File: stderr, Con: errCon, Node: p.spec.Node, Rank: rank, Crash: &p.crash, OnLine: po.OnLine}
	p.dir = dir
	p.flushes = append(p.flushes, po, pe)

	cmd := exec.Command(j.path, j.args...)
	if j.cpu != nil {
		// The rank joins its cgroup before it runs anything: a shell
		// moves itself in, then becomes the rank (exec keeps the pid).
		procs, err := j.cpu.Procs(p.spec.Rank)
		if err != nil {
			return fmt.Errorf("--cpus-per-rank: %w", err)
		}
		if cmd.Err != nil {
			return cmd.Err
		}
		if procs != "" { // else pinned only
			cmd = exec.Command("/bin/sh", append([]string{"-c", `echo $$ >"$0" && exec "$@"`, procs, cmd.Path}, j.args...)...)
		}
	}
	env := os.Environ()
	if _, ok := common[EnvKernels]; !ok {
		// No --kernels: the ranks get the device's own provider, not a
		// MESHRUN_KERNELS the launcher inherited and was told to ignore.
		env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, EnvKernels+"=") })
	}
	for k, v := range common {
		env = append(env, k+"="+v)
	}
	// Later entries win over inherited ones (os/exec keeps the last).
	env = append(env,
		"RANK="+strconv.Itoa(p.spec.Rank),
		"LOCAL_RANK="+strconv.Itoa(p.spec.LocalRank),
		"GOMAXPROCS="+strconv.Itoa(p.spec.GOMAXPROCS),
		runlog.EnvRankDir+"="+dir,
	)
	env = append(env, j.torchRankEnv(p.spec, dir)...)
	if p.spec.GPU != "" {
		env = append(env, "CUDA_VISIBLE_DEVICES="+p.spec.GPU)
	}
	cmd.Env = env
	cmd.Stdout = po
	cmd.Stderr = pe
	cmd.WaitDelay = waitDelay
	cmd.SysProcAttr = rankProcAttr()
	p.start = time.Now()
	start := cmd.Start
	if j.cpu != nil {
		start = func() error { return j.cpu.Start(cmd, p.spec.LocalRank) }
	}
	if err := start(); err != nil {
		return err
	}
	p.cmd, p.pid, p.done = cmd, cmd.Process.Pid, false
	p.out.PID = p.pid
	return nil
}

// writeJobRecord writes job.json into dir (the attempt's folder) once every
// rank has started.
func (j *job) writeJobRecord(dir string, procs []*proc, url string, common map[string]string, began time.Time, ev *events) {
	rec := JobRecord{
		JobID: j.id, Argv: redactArgs(j.Argv), Command: redactArgs(append([]string{j.path}, j.args...)),
		Started: began, NNodes: j.nnodes, NodeRank: j.NodeRank, World: j.world, NATSURL: redactText(url),
		Env: redactEnv(common), Versions: versions(),
		Device: j.device, Kernels: j.Kernels, DType: j.DType, ShareGPUs: j.ShareGPUs, CPUsPerRank: j.CPUsPerRank,
	}
	for _, p := range procs {
		rec.Ranks = append(rec.Ranks, RankRecord{
			Rank: p.spec.Rank, LocalRank: p.spec.LocalRank, Node: p.spec.Node,
			PID: p.pid, GOMAXPROCS: p.spec.GOMAXPROCS, GPU: p.spec.GPU,
		})
	}
	if err := writeJSON(filepath.Join(dir, JobFile), rec); err != nil {
		ev.emit("error", "error", err.Error())
	}
}
