package launch

import (
	"context"
	"encoding/json"
	"errors"
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

	"github.com/meshrun/meshrun/natsconn"
	"github.com/meshrun/meshrun/natsrv"
	"github.com/meshrun/meshrun/protocol"
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

// abortSettle is how long teardown waits between the abort broadcast and
// SIGTERM, so that peers blocked in a collective fail naming the root cause
// before they are signalled. It covers the collective layer's own wait for an
// earlier failure's notice when it sees a peer vanish (250 ms).
const abortSettle = 350 * time.Millisecond

// hangCheckEvery is how often --hang-after looks at the heartbeats.
const hangCheckEvery = 250 * time.Millisecond

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
	ev.emit("job_start", "job_id", j.id, "node", j.NodeRank, "nnodes", j.nnodes, "world_size", j.world,
		"local_ranks", len(j.ranks), "command", append([]string{j.path}, j.args...))
	fail := func(err error) (int, error) {
		ev.emit("job_end", "exit_code", 1, "error", err.Error())
		return 1, err
	}

	// The coordination plane: an embedded server on one machine, else the
	// external one every launcher of the job reaches.
	var (
		conf natsconn.Config // what the ranks use
		own  natsconn.Config // what the launcher uses
	)
	if j.NATS == "" {
		srv, err := natsrv.Start(natsrv.Options{Jobs: []string{j.id}})
		if err != nil {
			return fail(err)
		}
		defer srv.Shutdown()
		credsPath, err := filepath.Abs(filepath.Join(j.dir, CredsFile))
		// The credentials are useless once the server is gone; do not leave them.
		defer os.Remove(credsPath)
		if err == nil {
			err = srv.WriteCredentials(j.id, credsPath)
		}
		if err != nil {
			return fail(fmt.Errorf("nats credentials: %w", err))
		}
		admin := srv.Admin()
		conf = natsconn.Config{URL: srv.URL(), CredsFile: credsPath}
		own = natsconn.Config{URL: srv.URL(), Creds: &admin}
	} else {
		conf = j.natsConfig()
		for _, f := range []*string{&conf.CredsFile, &conf.CA, &conf.Cert, &conf.Key} {
			if *f != "" {
				if *f, err = filepath.Abs(*f); err != nil {
					return fail(err)
				}
			}
		}
		own = conf
	}
	url := conf.URL
	own.Name = fmt.Sprintf("meshrun-launcher-%d", j.NodeRank)
	pl, err := connectPlane(own, j.id, j.NodeRank, j.HangAfter > 0)
	if err != nil {
		return fail(err)
	}
	defer pl.close()
	ev.emit("nats_ready", "url", url, "embedded", j.NATS == "")

	common := map[string]string{
		"WORLD_SIZE":       strconv.Itoa(j.world),
		"LOCAL_WORLD_SIZE": strconv.Itoa(len(j.ranks)),
		"NNODES":           strconv.Itoa(j.nnodes),
		"NODE_RANK":        strconv.Itoa(j.NodeRank),
		"MESHRUN_NODE":     strconv.Itoa(j.NodeRank),
		"MESHRUN_JOB_ID":   j.id,
		EnvDevice:          j.device,
	}
	if j.Kernels != "" {
		common[EnvKernels] = j.Kernels
	}
	if j.DType != "" {
		common[EnvDType] = j.DType
	}
	for _, kv := range conf.Env() {
		k, v, _ := strings.Cut(kv, "=")
		common[k] = v
	}
	show, _ := j.consoleFilter()
	outCon := newConsole(j.Stdout, collapseWindow, show)
	errCon := newConsole(j.Stderr, collapseWindow, show)
	defer outCon.close()
	defer errCon.close()
	say := func(format string, a ...any) { errCon.notice(time.Now(), "launcher: "+fmt.Sprintf(format, a...)) }
	say("job %s, node %d of %d, %d of %d ranks, logs in %s", j.id, j.NodeRank, j.nnodes, len(j.ranks), j.world, j.dir)
	board := newProgressBoard(outCon, len(j.ranks))

	exits := make(chan exitMsg, len(j.ranks))
	procs := make([]*proc, len(j.ranks))
	byRank := map[int]*proc{}
	for i := range procs {
		procs[i] = &proc{spec: j.ranks[i], done: true}
		procs[i].out = RankOutcome{Rank: j.ranks[i].Rank, Node: j.NodeRank}
		byRank[j.ranks[i].Rank] = procs[i]
	}
	var (
		running  int
		root     *RootCause // the first failure, across nodes
		reason   = "ok"
		tearing  bool
		victims  []int
		termC    <-chan time.Time
		killC    <-chan time.Time
		notice   *NoticeReport
		hangs    []HangReport
		reported = map[string]bool{}
		fatalErr error // a problem the plane reported (pl.fatal)
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
	teardown := func(why, detail string) {
		if tearing {
			return
		}
		tearing, reason = true, why
		for _, p := range procs {
			if !p.done {
				victims = append(victims, p.spec.Rank)
			}
		}
		ev.emit("teardown", "reason", why, "detail", detail, "victims", victims, "grace_ms", j.Grace.Milliseconds())
		// Peers blocked in a collective fail at once, naming the cause.
		if err := pl.abort(detail); err != nil {
			ev.emit("error", "error", "abort broadcast: "+err.Error())
		}
		termC = time.After(abortSettle)
	}
	// failed records a local rank's failure; the first one (across nodes) is
	// the root cause.
	failed := func(rc RootCause) {
		if root == nil || rc.TimeMS < root.TimeMS {
			root = &rc
		}
	}

	for _, p := range procs {
		if err := j.start(p, common, outCon, errCon, board); err != nil {
			now := time.Now()
			p.out.ExitCode, p.out.Error, p.out.EndMS = ExitStartFailed, err.Error(), now.UnixMilli()
			ev.emit("rank_start_failed", "rank", p.spec.Rank, "error", err.Error())
			say("rank %d did not start: %v", p.spec.Rank, err)
			failed(RootCause{Rank: p.spec.Rank, Node: j.NodeRank, ExitCode: ExitStartFailed, TimeMS: now.UnixMilli(), Error: err.Error()})
			pl.tell(nodeMsg{Kind: "rank_failed", Rank: p.spec.Rank, ExitCode: ExitStartFailed, TimeMS: now.UnixMilli()})
			teardown("rank_failed", fmt.Sprintf("rank %d (node %d) did not start", p.spec.Rank, j.NodeRank))
			break
		}
		running++
		ev.emit("rank_start", "rank", p.spec.Rank, "pid", p.pid)
		go func(p *proc) {
			err := p.cmd.Wait()
			exits <- exitMsg{rank: p.spec.Rank, state: p.cmd.ProcessState, err: err, end: time.Now()}
		}(p)
	}
	j.writeJobRecord(procs, url, common, began, ev)

	var timeoutC <-chan time.Time
	if j.Timeout > 0 {
		t := time.NewTimer(j.Timeout - time.Since(began))
		defer t.Stop()
		timeoutC = t.C
	}
	var hangC <-chan time.Time
	if j.HangAfter > 0 {
		t := time.NewTicker(hangCheckEvery)
		defer t.Stop()
		hangC = t.C
	}
	done := ctx.Done()
	for running > 0 {
		select {
		case m := <-exits:
			running--
			p := byRank[m.rank]
			p.done = true
			p.out.DurationMS = m.end.Sub(p.start).Milliseconds()
			p.out.EndMS = m.end.UnixMilli()
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
				failed(RootCause{Rank: m.rank, Node: j.NodeRank, ExitCode: p.out.ExitCode, Signal: p.out.Signal, TimeMS: p.out.EndMS})
				pl.tell(nodeMsg{Kind: "rank_failed", Rank: m.rank, ExitCode: p.out.ExitCode, Signal: p.out.Signal, TimeMS: p.out.EndMS})
				how := fmt.Sprintf("exited with code %d", p.out.ExitCode)
				if p.out.Signal != "" {
					how = "was killed by " + p.out.Signal
				}
				say("rank %d (node %d, pid %d) %s: tearing the job down", m.rank, j.NodeRank, p.pid, how)
				teardown("rank_failed", fmt.Sprintf("rank %d (node %d) %s", m.rank, j.NodeRank, how))
			}
		case m := <-pl.remote:
			ev.emit("remote_"+m.Kind, "node", m.Node, "rank", m.Rank, "exit_code", m.ExitCode, "signal", m.Signal, "time_ms", m.TimeMS, "reason", m.Reason)
			switch m.Kind {
			case "rank_failed":
				failed(RootCause{Rank: m.Rank, Node: m.Node, ExitCode: m.ExitCode, Signal: m.Signal, TimeMS: m.TimeMS})
				if !tearing {
					say("rank %d on node %d failed (exit %d): tearing this node's ranks down", m.Rank, m.Node, m.ExitCode)
				}
				teardown("rank_failed", fmt.Sprintf("rank %d (node %d) failed with exit code %d", m.Rank, m.Node, m.ExitCode))
			case "teardown":
				teardown(m.Reason, fmt.Sprintf("node %d ended the job: %s", m.Node, m.Reason))
			}
		case n := <-pl.notices:
			if notice == nil && !n.Abort && n.Code != protocol.CodePeerClosed {
				notice = &NoticeReport{TimeMS: time.Now().UnixMilli(), Code: n.Code, Culprit: n.Rank, Reporter: n.Reporter,
					Op: n.Op, Seq: n.Seq, Group: n.Group, Detail: n.Detail}
				ev.emit("collective_failure", "code", n.Code, "culprit_rank", n.Rank, "reporter_rank", n.Reporter, "op", n.Op, "seq", n.Seq, "group", n.Group, "detail", n.Detail)
				where := ""
				if n.Op != "" {
					where = fmt.Sprintf(" in %s seq %d on group %s", n.Op, n.Seq, n.Group)
				}
				say("rank %d reports %s%s, blaming rank %d: %s", n.Reporter, n.Code, where, n.Rank, n.Detail)
			}
		case <-hangC:
			now := time.Now()
			for _, h := range pl.hangs(now, j.HangAfter) {
				key := fmt.Sprintf("%s/%d", h.Group, h.Seq)
				if reported[key] {
					continue
				}
				reported[key] = true
				hr := HangReport{TimeMS: now.UnixMilli(), Op: h.Op, Seq: h.Seq, Group: h.Group, Waiting: h.Waiting, Missing: h.Missing,
					WaitingMS: now.Sub(h.Since).Milliseconds(), States: map[string]string{}}
				var about []string
				for _, r := range h.Missing {
					what := fmt.Sprintf("rank %d", r)
					if p := byRank[r]; p != nil && !p.done {
						if st := processState(p.pid); st != "" {
							hr.States[strconv.Itoa(r)] = st
							what += " (pid " + strconv.Itoa(p.pid) + ", " + st + ")"
						}
					}
					if t, ok := pl.lastBeat(r); ok {
						what += fmt.Sprintf(", last heartbeat %.1f s ago", now.Sub(t).Seconds())
					}
					about = append(about, what)
				}
				hangs = append(hangs, hr)
				ev.emit("hang", "op", h.Op, "seq", h.Seq, "group", h.Group, "waiting", h.Waiting, "missing", h.Missing,
					"waiting_ms", hr.WaitingMS, "process_states", hr.States)
				say("hang: %s seq %d on group %s: ranks %s waiting %.1f s; missing: %s", h.Op, h.Seq, h.Group,
					FormatRanks(h.Waiting), float64(hr.WaitingMS)/1000, strings.Join(about, "; "))
				var asked []int
				for _, p := range procs {
					if !p.done && p.stacks.Load() {
						syscall.Kill(p.pid, syscall.SIGUSR1)
						asked = append(asked, p.spec.Rank)
					}
				}
				if len(asked) > 0 {
					ev.emit("stacks_requested", "ranks", asked)
					say("goroutine stacks requested from ranks %s (rank-NNNNN/%s*.txt; a stopped rank writes its own when it resumes)",
						FormatRanks(asked), runlog.StacksPrefix)
				}
			}
		case err := <-pl.fatal:
			if !tearing {
				fatalErr = err
				say("%v: tearing the job down", err)
				teardown("fatal", err.Error())
			}
		case <-timeoutC:
			timeoutC = nil
			pl.tell(nodeMsg{Kind: "teardown", Reason: "timeout", TimeMS: time.Now().UnixMilli()})
			teardown("timeout", fmt.Sprintf("the job timed out after %v", j.Timeout))
		case <-done:
			done = nil
			pl.tell(nodeMsg{Kind: "teardown", Reason: "interrupted", TimeMS: time.Now().UnixMilli()})
			teardown("interrupted", "the launcher was interrupted")
		case <-termC:
			termC = nil
			signalAll(syscall.SIGTERM)
			// A stopped rank (SIGSTOP, Ctrl-Z) would hold SIGTERM until resumed.
			signalAll(syscall.SIGCONT)
			killC = time.After(j.Grace)
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
	// With several nodes, another node's earlier failure may still be on its way.
	if j.nnodes > 1 && reason == "rank_failed" {
		settle := time.After(300 * time.Millisecond)
	drain:
		for {
			select {
			case m := <-pl.remote:
				if m.Kind == "rank_failed" {
					failed(RootCause{Rank: m.Rank, Node: m.Node, ExitCode: m.ExitCode, Signal: m.Signal, TimeMS: m.TimeMS})
				}
			case <-settle:
				break drain
			}
		}
	}

	code := 0
	switch reason {
	case "rank_failed":
		code = root.ExitCode
	case "timeout":
		code = ExitTimeout
	case "interrupted":
		code = ExitInterrupted
	case "fatal":
		code = 1
	}
	sum := Summary{
		JobID: j.id, Node: j.NodeRank, NNodes: j.nnodes, WorldSize: j.world, ExitCode: code, Reason: reason, Victims: victims,
		Notice: notice, Hangs: hangs, DurationMS: time.Since(began).Milliseconds(),
	}
	if victims == nil {
		sum.Victims = []int{}
	}
	if fatalErr != nil {
		sum.Error = fatalErr.Error()
	}
	if root != nil && reason == "rank_failed" {
		if p := byRank[root.Rank]; p != nil && root.Node == j.NodeRank {
			if rec, ok := readErrorFile(filepath.Join(j.dir, RankDir(root.Rank))); ok {
				root.Error, root.Culprit = rec.Error, rec.Culprit
			}
		}
		rc := root.Rank
		sum.RootCauseRank, sum.RootCause = &rc, root
	}
	for _, p := range procs {
		sum.Ranks = append(sum.Ranks, p.out)
	}
	if err := writeJSON(filepath.Join(j.dir, SummaryFile), sum); err != nil {
		say("%v", err)
	}
	ev.emit("job_end", "exit_code", code, "reason", reason)

	switch reason {
	case "rank_failed":
		how := fmt.Sprintf("exited with code %d", root.ExitCode)
		if root.Signal != "" {
			how = fmt.Sprintf("was killed by %s (exit %d)", root.Signal, root.ExitCode)
		}
		if root.ExitCode == ExitStartFailed && root.Error != "" {
			how = "did not start: " + root.Error
		}
		where := fmt.Sprintf("node %d", root.Node)
		if p := byRank[root.Rank]; p != nil && root.Node == j.NodeRank {
			where += fmt.Sprintf(", pid %d", p.pid)
		}
		blame := ""
		if root.Culprit != nil && *root.Culprit != root.Rank {
			blame = fmt.Sprintf(" (its error blames rank %d)", *root.Culprit)
		}
		return code, fmt.Errorf("%w: root cause rank %d (%s) %s at %s%s; %d other ranks torn down; logs in %s",
			ErrRankFailed, root.Rank, where, how, time.UnixMilli(root.TimeMS).Format(consoleStamp), blame, len(victims), j.dir)
	case "timeout":
		return code, fmt.Errorf("timed out after %v; %d ranks torn down; logs in %s", j.Timeout, len(victims), j.dir)
	case "interrupted":
		return code, fmt.Errorf("interrupted; %d ranks torn down; logs in %s", len(victims), j.dir)
	case "fatal":
		return code, fmt.Errorf("%v; %d ranks torn down; logs in %s", fatalErr, len(victims), j.dir)
	}
	return 0, nil
}

// readErrorFile reads a rank's error.json.
func readErrorFile(dir string) (runlog.ErrorRecord, bool) {
	var rec runlog.ErrorRecord
	b, err := os.ReadFile(filepath.Join(dir, runlog.ErrorFile))
	if err != nil || json.Unmarshal(b, &rec) != nil {
		return rec, false
	}
	return rec, true
}

// start starts one rank in its own process group, with its output going,
// stamped, to its log files and, prefixed, to the console.
func (j *job) start(p *proc, common map[string]string, outCon, errCon *console, board *progressBoard) error {
	dir, err := filepath.Abs(filepath.Join(j.dir, RankDir(p.spec.Rank)))
	if err != nil {
		return err
	}
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
	rank := p.spec.Rank
	po := &rankWriter{file: stdout, con: outCon, node: p.spec.Node, rank: rank, onMarker: func(kind string, body []byte) {
		switch kind {
		case "progress":
			board.report(rank, body)
		case "hello":
			var h struct {
				Stacks bool `json:"stacks_on_sigusr1"`
			}
			if json.Unmarshal(body, &h) == nil && h.Stacks {
				p.stacks.Store(true)
			}
		}
	}}
	pe := &rankWriter{file: stderr, con: errCon, node: p.spec.Node, rank: rank}
	p.flushes = append(p.flushes, po, pe)

	cmd := exec.Command(j.path, j.args...)
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
	if p.spec.GPU != "" {
		env = append(env, "CUDA_VISIBLE_DEVICES="+p.spec.GPU)
	}
	cmd.Env = env
	cmd.Stdout = po
	cmd.Stderr = pe
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
		Started: began, NNodes: j.nnodes, NodeRank: j.NodeRank, World: j.world, NATSURL: url,
		Env: common, Versions: versions(),
		Device: j.device, Kernels: j.Kernels, DType: j.DType, ShareGPUs: j.ShareGPUs,
	}
	for _, p := range procs {
		rec.Ranks = append(rec.Ranks, RankRecord{
			Rank: p.spec.Rank, LocalRank: p.spec.LocalRank, Node: p.spec.Node,
			PID: p.pid, GOMAXPROCS: p.spec.GOMAXPROCS, GPU: p.spec.GPU,
		})
	}
	if err := writeJSON(filepath.Join(j.dir, JobFile), rec); err != nil {
		ev.emit("error", "error", err.Error())
	}
}
