package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/natsrv"
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
}

// exitMsg reports a rank's end from its waiting goroutine.
type exitMsg struct {
	rank  int
	state *os.ProcessState
	err   error
	end   time.Time
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
	syscall.SIGILL: "SIGILL", syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS",
	syscall.SIGFPE: "SIGFPE", syscall.SIGKILL: "SIGKILL", syscall.SIGSEGV: "SIGSEGV",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
	syscall.SIGUSR1: "SIGUSR1", syscall.SIGUSR2: "SIGUSR2",
}

func signalName(s syscall.Signal) string {
	if n, ok := signalNames[s]; ok {
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

// run starts every rank, supervises them and writes the job folder.
func (j *job) run(ctx context.Context) (int, error) {
	began := time.Now()
	if err := ctx.Err(); err != nil {
		return ExitInterrupted, fmt.Errorf("interrupted before start: %w", err)
	}
	if _, err := os.Stat(filepath.Join(j.dir, JobFile)); err == nil {
		return ExitUsage, fmt.Errorf("%w: job folder %s already holds a job; pick another --job-id", ErrInvalid, j.dir)
	}
	if err := os.MkdirAll(j.dir, 0o755); err != nil {
		return 1, fmt.Errorf("job folder: %w", err)
	}
	ev, err := openEvents(j.dir)
	if err != nil {
		return 1, fmt.Errorf("job folder: %w", err)
	}
	defer ev.close()
	ev.emit("job_start", "job_id", j.id, "world_size", len(j.ranks), "command", append([]string{j.path}, j.args...))

	srv, err := natsrv.Start(natsrv.Options{Jobs: []string{j.id}})
	if err != nil {
		ev.emit("job_end", "exit_code", 1, "error", err.Error())
		return 1, err
	}
	defer srv.Shutdown()
	credsPath, err := filepath.Abs(filepath.Join(j.dir, CredsFile))
	// The credentials are useless once the server is gone; do not leave them.
	defer os.Remove(credsPath)
	if err == nil {
		err = srv.WriteCredentials(j.id, credsPath)
	}
	if err != nil {
		ev.emit("job_end", "exit_code", 1, "error", err.Error())
		return 1, fmt.Errorf("nats credentials: %w", err)
	}
	ev.emit("nats_ready", "url", srv.URL())

	common := map[string]string{
		"WORLD_SIZE":         strconv.Itoa(len(j.ranks)),
		"LOCAL_WORLD_SIZE":   strconv.Itoa(len(j.ranks)),
		"NNODES":             strconv.Itoa(j.nnodes),
		"NODE_RANK":          "0",
		"MESHRUN_JOB_ID":     j.id,
		"MESHRUN_NATS_URL":   srv.URL(),
		"MESHRUN_NATS_CREDS": credsPath,
	}
	fmt.Fprintf(j.Stderr, "launcher: job %s, %d ranks, logs in %s\n", j.id, len(j.ranks), j.dir)

	outCon := &console{w: j.Stdout}
	errCon := &console{w: j.Stderr}
	exits := make(chan exitMsg, len(j.ranks))
	procs := make([]*proc, len(j.ranks))
	for i := range procs {
		procs[i] = &proc{spec: j.ranks[i], done: true}
		procs[i].out = RankOutcome{Rank: j.ranks[i].Rank}
	}
	var (
		running   int
		rootCause = -1
		reason    = "ok"
		tearing   bool
		victims   []int
		killC     <-chan time.Time
	)
	signalAll := func(sig syscall.Signal) {
		for _, p := range procs {
			if p.pid > 0 {
				// The negative pid names the rank's process group: the rank
				// and every process it started.
				syscall.Kill(-p.pid, sig)
			}
		}
	}
	teardown := func(why string, rank int) {
		if tearing {
			return
		}
		tearing, reason = true, why
		for _, p := range procs {
			if !p.done {
				victims = append(victims, p.spec.Rank)
			}
		}
		ev.emit("teardown", "reason", why, "rank", rank, "victims", victims, "grace_ms", j.Grace.Milliseconds())
		signalAll(syscall.SIGTERM)
		killC = time.After(j.Grace)
	}

	for i, p := range procs {
		if err := j.start(p, common, outCon, errCon); err != nil {
			p.out.ExitCode, p.out.Error = ExitStartFailed, err.Error()
			ev.emit("rank_start_failed", "rank", p.spec.Rank, "error", err.Error())
			fmt.Fprintf(j.Stderr, "launcher: rank %d did not start: %v\n", p.spec.Rank, err)
			rootCause = i
			teardown("rank_failed", i)
			break
		}
		running++
		ev.emit("rank_start", "rank", p.spec.Rank, "pid", p.pid)
		go func(p *proc) {
			err := p.cmd.Wait()
			exits <- exitMsg{rank: p.spec.Rank, state: p.cmd.ProcessState, err: err, end: time.Now()}
		}(p)
	}
	j.writeJobRecord(procs, srv.URL(), common, began, ev)

	var timeoutC <-chan time.Time
	if j.Timeout > 0 {
		t := time.NewTimer(j.Timeout - time.Since(began))
		defer t.Stop()
		timeoutC = t.C
	}
	done := ctx.Done()
	for running > 0 {
		select {
		case m := <-exits:
			running--
			p := procs[m.rank]
			p.done = true
			p.out.DurationMS = m.end.Sub(p.start).Milliseconds()
			if m.state != nil {
				p.out.ExitCode, p.out.Signal = exitCode(m.state)
			} else {
				p.out.ExitCode = 1
			}
			if m.err != nil && !errors.Is(m.err, exec.ErrWaitDelay) {
				if _, isExit := m.err.(*exec.ExitError); !isExit {
					p.out.Error = m.err.Error()
				}
			}
			ev.emit("rank_exit", "rank", m.rank, "pid", p.pid, "exit_code", p.out.ExitCode, "signal", p.out.Signal, "duration_ms", p.out.DurationMS)
			if p.out.ExitCode != 0 && !tearing {
				rootCause = m.rank
				teardown("rank_failed", m.rank)
			}
		case <-timeoutC:
			timeoutC = nil
			teardown("timeout", -1)
		case <-done:
			done = nil
			teardown("interrupted", -1)
		case <-killC:
			killC = nil
			ev.emit("sigkill", "ranks_left", running)
			signalAll(syscall.SIGKILL)
		}
	}
	// No orphans: whatever a rank left behind in its group goes too.
	signalAll(syscall.SIGKILL)
	for _, p := range procs {
		for _, c := range p.flushes {
			c.Close()
		}
		for _, f := range p.files {
			f.Close()
		}
	}

	code := 0
	switch reason {
	case "rank_failed":
		code = procs[rootCause].out.ExitCode
	case "timeout":
		code = ExitTimeout
	case "interrupted":
		code = ExitInterrupted
	}
	sum := Summary{
		JobID: j.id, ExitCode: code, Reason: reason, Victims: victims,
		DurationMS: time.Since(began).Milliseconds(),
	}
	if victims == nil {
		sum.Victims = []int{}
	}
	if rootCause >= 0 {
		rc := rootCause
		sum.RootCause = &rc
	}
	for _, p := range procs {
		sum.Ranks = append(sum.Ranks, p.out)
	}
	if err := writeJSON(filepath.Join(j.dir, SummaryFile), sum); err != nil {
		fmt.Fprintf(j.Stderr, "launcher: %v\n", err)
	}
	ev.emit("job_end", "exit_code", code, "reason", reason)

	switch reason {
	case "rank_failed":
		o := procs[rootCause].out
		how := fmt.Sprintf("exited with code %d", o.ExitCode)
		if o.Signal != "" {
			how = fmt.Sprintf("was killed by %s (exit %d)", o.Signal, o.ExitCode)
		}
		if o.Error != "" {
			how = "did not start: " + o.Error
		}
		return code, fmt.Errorf("%w: root cause rank %d (pid %d) %s; %d other ranks torn down; logs in %s",
			ErrRankFailed, rootCause, procs[rootCause].pid, how, len(victims), j.dir)
	case "timeout":
		return code, fmt.Errorf("timed out after %v; %d ranks torn down; logs in %s", j.Timeout, len(victims), j.dir)
	case "interrupted":
		return code, fmt.Errorf("interrupted; %d ranks torn down; logs in %s", len(victims), j.dir)
	}
	return 0, nil
}

// start starts one rank in its own process group, with its output going to its
// log files and, prefixed, to the console.
func (j *job) start(p *proc, common map[string]string, outCon, errCon *console) error {
	dir := filepath.Join(j.dir, RankDir(p.spec.Rank))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	stdout, err := os.Create(filepath.Join(dir, "stdout.log"))
	if err != nil {
		return err
	}
	p.files = append(p.files, stdout)
	stderr, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return err
	}
	p.files = append(p.files, stderr)
	po := newPrefixer(outCon, p.spec.Node, p.spec.Rank)
	pe := newPrefixer(errCon, p.spec.Node, p.spec.Rank)
	p.flushes = append(p.flushes, po, pe)

	cmd := exec.Command(j.path, j.args...)
	env := os.Environ()
	for k, v := range common {
		env = append(env, k+"="+v)
	}
	// Later entries win over inherited ones (os/exec keeps the last).
	env = append(env,
		"RANK="+strconv.Itoa(p.spec.Rank),
		"LOCAL_RANK="+strconv.Itoa(p.spec.LocalRank),
		"GOMAXPROCS="+strconv.Itoa(p.spec.GOMAXPROCS),
	)
	cmd.Env = env
	cmd.Stdout = io.MultiWriter(stdout, po)
	cmd.Stderr = io.MultiWriter(stderr, pe)
	cmd.WaitDelay = waitDelay
	cmd.SysProcAttr = rankProcAttr()
	p.start = time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	p.cmd, p.pid, p.done = cmd, cmd.Process.Pid, false
	p.out.PID = p.pid
	return nil
}

// writeJobRecord writes job.json once every rank has started.
func (j *job) writeJobRecord(procs []*proc, url string, common map[string]string, began time.Time, ev *events) {
	rec := JobRecord{
		JobID: j.id, Argv: j.Argv, Command: append([]string{j.path}, j.args...),
		Started: began, NNodes: j.nnodes, World: len(j.ranks), NATSURL: url,
		Env: common, Versions: versions(),
	}
	for _, p := range procs {
		rec.Ranks = append(rec.Ranks, RankRecord{
			Rank: p.spec.Rank, LocalRank: p.spec.LocalRank, Node: p.spec.Node,
			PID: p.pid, GOMAXPROCS: p.spec.GOMAXPROCS,
		})
	}
	if err := writeJSON(filepath.Join(j.dir, JobFile), rec); err != nil {
		ev.emit("error", "error", err.Error())
	}
}
