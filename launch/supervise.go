package launch

import (
	"context"
	"errors"
	"fmt"
	"github.com/meshrun/meshrun/logview"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/natsconn"
	"github.com/meshrun/meshrun/natsrv"
	"github.com/meshrun/meshrun/protocol"
	"github.com/meshrun/meshrun/runlog"
)

// ErrHang reports a job that ended because a rank never entered a collective
// its peers waited in; the error names the rank.
var ErrHang = errors.New("hang")

// hangStacksSettle is how long the launcher lets the ranks write their stacks
// (asked on a hang) before it tears the job down.
const hangStacksSettle = 500 * time.Millisecond

// restartWait bounds how long a launcher waits for the other nodes' launchers
// to finish an attempt before the next (several nodes).
const restartWait = 60 * time.Second

// run runs the job: its folder and coordination plane, then one attempt, or
// up to 1 + --max-restarts of them, and the summary.
func (j *job) run(ctx context.Context) (int, error) {
	began := time.Now()
	if err := ctx.Err(); err != nil {
		return ExitInterrupted, fmt.Errorf("interrupted before start: %w", err)
	}
	if err := j.makeJobDir(); err != nil {
		return 1, cannotStart{fmt.Errorf("job folder: %w", err)}
	}
	ev, err := openEvents(j.dir)
	if errors.Is(err, os.ErrExist) {
		// The folder is another launcher's (the events file is created
		// exclusively): this job id ran here before, or another node of the
		// job shares this --log-dir.
		if _, other := jobStart(filepath.Join(j.dir, EventsFile)); j.nnodes > 1 && other >= 0 && other != j.NodeRank {
			return ExitUsage, fmt.Errorf("%w: job folder %s holds node %d's logs of job %s: with several nodes on one file system give each node its own --log-dir (e.g. runs/node-%d)",
				ErrInvalid, j.dir, other, j.id, j.NodeRank)
		}
		return ExitUsage, fmt.Errorf("%w: job folder %s already holds a job; pick another --job-id", ErrInvalid, j.dir)
	}
	if err != nil {
		return 1, cannotStart{fmt.Errorf("job folder: %w", err)}
	}
	reserveSpace(j.dir)
	defer os.Remove(filepath.Join(j.dir, reserveFile))
	defer ev.close()
	ev.emit("job_start", "job_id", j.id, "node", j.NodeRank, "nnodes", j.nnodes, "world_size", j.world,
		"local_ranks", len(j.ranks), "command", redactArgs(append([]string{j.path}, j.args...)), "max_restarts", j.MaxRestarts,
		"launcher_pid", os.Getpid())
	if stale := cleanStaleCreds(j.LogDir); len(stale) > 0 {
		ev.emit("stale_creds_removed", "files", stale)
	}
	fail := func(err error) (int, error) {
		ev.emit("job_end", "exit_code", 1, "error", err.Error())
		return 1, cannotStart{err}
	}

	show, _ := j.consoleFilter()
	outCon := newConsole(j.Stdout, collapseWindow, func(r int) bool { return show(r) && j.shown(r, 1) })
	errCon := newConsole(j.Stderr, collapseWindow, func(r int) bool { return show(r) && j.shown(r, 2) })
	defer outCon.close()
	defer errCon.close()
	say := func(format string, a ...any) { errCon.notice(time.Now(), "launcher: "+fmt.Sprintf(format, a...)) }

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
		if j.guard, err = startGuard(j.tag, credsPath); err != nil {
			say("%v: ranks' children may outlive a launcher killed by a signal", err)
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
		if j.guard, err = startGuard(j.tag, ""); err != nil {
			say("%v: ranks' children may outlive a launcher killed by a signal", err)
		}
	}
	defer j.guard.done()
	defer noteSecrets(j.NATS == "", conf, own)()
	url := conf.URL
	own.Name = fmt.Sprintf("meshrun-launcher-%d", j.NodeRank)
	// Node 0 reads every rank's heartbeats (it looks for hangs and tells the
	// others); the other nodes read their own ranks'.
	var local []int
	if j.NodeRank != 0 {
		for _, r := range j.ranks {
			local = append(local, r.Rank)
		}
	}
	pl, err := connectPlane(own, j.id, j.NodeRank, local, say)
	if err != nil {
		return fail(err)
	}
	defer pl.close()
	if j.NATS != "" {
		if err := pl.announce(j.hello(), presenceWindow, say); err != nil {
			// Not told to the others: the job that runs is theirs.
			ev.emit("job_end", "exit_code", ExitUsage, "error", err.Error())
			return ExitUsage, err
		}
	}
	ev.emit("nats_ready", "url", url, "embedded", j.NATS == "")

	say("job %s, node %d of %d, %d of %d ranks, logs in %s", j.id, j.NodeRank, j.nnodes, len(j.ranks), j.world, j.dir)

	common := j.commonEnv(conf)
	var timeoutC <-chan time.Time
	if j.Timeout > 0 {
		t := time.NewTimer(j.Timeout - time.Since(began))
		defer t.Stop()
		timeoutC = t.C
	}
	var (
		sums []AttemptSummary
		last *attempt
	)
	for n := 0; ; n++ {
		a := &attempt{j: j, n: n, ev: ev, pl: pl, url: url, say: say, outCon: outCon, errCon: errCon, began: time.Now(),
			reported: map[string]bool{}, remoteFails: map[int]RootCause{}, stoppedStates: map[int]string{}}
		if err := a.prepare(common); err != nil {
			a.onFatal(err) // the other nodes' ranks would wait for this one's
		} else {
			a.run(ctx, timeoutC)
		}
		s := a.summary()
		if n > 0 {
			if err := writeJSON(filepath.Join(a.dir, SummaryFile), s); err != nil {
				say("%v", err)
			}
		}
		sums, last = append(sums, s), a
		if n >= j.MaxRestarts {
			break
		}
		restart, why := restartable(a.outcome), fmt.Sprintf("attempt %d ended (%s, exit %d)", n, a.outcome, s.ExitCode)
		if j.nnodes > 1 {
			// Every node restarts, or none: each says how its ranks ended.
			outs, err := pl.attemptDone(n, a.outcome, j.nnodes, restartWait)
			if err != nil {
				say("%v", err)
				break
			}
			restart = false
			for node := 0; node < j.nnodes; node++ {
				o := outs[node]
				if !restartable(o) && o != OutcomeOK {
					restart = false
					break
				}
				if restartable(o) && !restart {
					restart = true
					why = fmt.Sprintf("attempt %d ended (%s on node %d)", n, o, node)
				}
			}
		}
		if !restart {
			break
		}
		say("%s: restarting every rank (restart %d of %d)", why, n+1, j.MaxRestarts)
		ev.emit("restart", "attempt", n+1, "after", a.outcome, "exit_code", s.ExitCode)
		pl.reset()
	}
	if j.nnodes > 1 && j.NodeRank == 0 && (j.MasterAddr == "" || j.MasterPort == 0) && last.env != nil && last.outcome == OutcomeOK {
		if missing := pl.mastersHandedOut(last.n, j.nnodes, restartWait); len(missing) > 0 {
			say("nodes %s never asked for MASTER_ADDR/MASTER_PORT of attempt %d", FormatRanks(missing), last.n)
		}
	}
	s := sums[len(sums)-1]
	sum := Summary{JobID: j.id, Node: j.NodeRank, NNodes: j.nnodes, WorldSize: j.world, AttemptSummary: s,
		DurationMS: time.Since(began).Milliseconds(), Attempts: sums}
	if err := writeJSON(filepath.Join(j.dir, SummaryFile), sum); err != nil {
		say("%v", err)
	}
	ev.emit("job_end", "exit_code", s.ExitCode, "reason", s.Reason, "attempts", len(sums))
	return s.ExitCode, last.err()
}

// attemptDir is the folder of attempt n's ranks: the job folder for the
// first, attempt-N in it after.
func (j *job) attemptDir(n int) string {
	if n == 0 {
		return j.dir
	}
	return filepath.Join(j.dir, AttemptDir(n))
}

// nodeOf is the node of a rank (every node runs as many ranks).
func (j *job) nodeOf(rank int) int { return rank / len(j.ranks) }

// commonEnv is the environment every rank of every attempt gets, besides
// what the launcher inherited.
// envCollectives chooses the collective backend of device buffers (package
// collective's EnvBackend).
const envCollectives = "MESHRUN_COLLECTIVES"

// sharesGPU reports whether two cuda ranks of this node were given one GPU
// (--share-gpus).
func (j *job) sharesGPU() bool {
	seen := map[string]bool{}
	for _, r := range j.ranks {
		if r.GPU != "" && seen[r.GPU] {
			return true
		}
		seen[r.GPU] = true
	}
	return false
}

func (j *job) commonEnv(conf natsconn.Config) map[string]string {
	common := map[string]string{
		"WORLD_SIZE":       strconv.Itoa(j.world),
		"LOCAL_WORLD_SIZE": strconv.Itoa(len(j.ranks)),
		"NNODES":           strconv.Itoa(j.nnodes),
		"NODE_RANK":        strconv.Itoa(j.NodeRank),
		"MESHRUN_NODE":     strconv.Itoa(j.NodeRank),
		"MESHRUN_JOB_ID":   j.id,
		EnvLauncherTag:     j.tag,
		EnvDevice:          j.device,
	}
	if j.Kernels != "" {
		common[EnvKernels] = j.Kernels
	}
	if j.DType != "" {
		common[EnvDType] = j.DType
	}
	if j.TraceMax != "" {
		common[runlog.EnvTraceMax] = j.TraceMax
	}
	for k, v := range j.torchEnv() {
		common[k] = v
	}
	if _, set := os.LookupEnv(envCollectives); !set && j.sharesGPU() {
		// NCCL refuses two ranks of a communicator on one GPU.
		common[envCollectives] = "staged"
	}
	for _, kv := range conf.Env() {
		k, v, _ := strings.Cut(kv, "=")
		common[k] = v
	}
	return common
}

// attempt supervises one run of every rank of the job: one handler per
// event, and a typed outcome.
type attempt struct {
	j              *job
	n              int    // 0 first, then each restart
	dir            string // its ranks' folders go here
	ev             *events
	pl             *plane
	url            string
	say            func(format string, a ...any)
	outCon, errCon *console
	board          *progressBoard
	began          time.Time
	env            map[string]string // every rank's (common and this attempt's)

	procs   []*proc
	byRank  map[int]*proc
	exits   chan exitMsg
	running int

	outcome  Outcome
	tearing  bool
	root     *RootCause // the first failure, across nodes
	victims  []int
	termC    <-chan time.Time
	killC    <-chan time.Time
	hangC    <-chan time.Time // a hang was found: tear down once stacks are written
	hangWhy  string
	notice   *NoticeReport
	hangs    []HangReport
	reported map[string]bool
	fatalErr error
	// remoteFails: the failures other nodes reported, by rank (blame.go).
	remoteFails map[int]RootCause
	// stoppedStates: ranks found stopped (SIGSTOP) at teardown.
	stoppedStates map[int]string
	// early: ranks that exited 0 while the attempt ran, by end time (ms),
	// until judged (judgeEarly); earlyC fires to judge them.
	early  map[int]int64
	earlyC <-chan time.Time
	tearAt time.Time // when the teardown began
	// termAt, killAt: when the teardown sent SIGTERM, SIGKILL (zero: not yet).
	termAt, killAt time.Time
}

// prepare makes the attempt's folder and environment.
func (a *attempt) prepare(common map[string]string) error {
	a.dir = a.j.attemptDir(a.n)
	if err := a.j.makeDir(a.dir); err != nil {
		return fmt.Errorf("attempt folder: %w", err)
	}
	a.env = make(map[string]string, len(common)+4)
	for k, v := range common {
		a.env[k] = v
	}
	a.env["TORCHELASTIC_RESTART_COUNT"] = strconv.Itoa(a.n)
	addr, port, err := a.j.master(a.pl, a.n)
	if err != nil {
		return err
	}
	a.env["MASTER_ADDR"], a.env["MASTER_PORT"] = addr, strconv.Itoa(port)
	a.board = newProgressBoard(a.outCon, len(a.j.ranks))
	if a.n > 0 {
		a.say("attempt %d: logs in %s", a.n, a.dir)
	}
	a.ev.emit("attempt_start", "attempt", a.n, "dir", a.dir, "master_addr", addr, "master_port", port)
	return nil
}

// run starts every rank and handles events until the last has exited.
func (a *attempt) run(ctx context.Context, timeoutC <-chan time.Time) {
	j := a.j
	a.exits = make(chan exitMsg, len(j.ranks))
	a.procs = make([]*proc, len(j.ranks))
	a.byRank = map[int]*proc{}
	for i := range a.procs {
		a.procs[i] = &proc{spec: j.ranks[i], done: true}
		a.procs[i].out = RankOutcome{Rank: j.ranks[i].Rank, Node: j.NodeRank}
		a.byRank[j.ranks[i].Rank] = a.procs[i]
	}
	for i, p := range a.procs {
		// Ranks that already exited are judged between starts: a rank that
		// fails while later ones start is seen first, and stops the rest
		// from starting; so does an interrupt.
		a.drainExits()
		if a.tearing || ctx.Err() != nil {
			for _, q := range a.procs[i:] {
				q.out.Error = "not started: the job ended first"
			}
			break
		}
		if err := j.start(p, a.dir, a.env, a.outCon, a.errCon, a.board); err != nil {
			a.onStartFailed(p, err)
			break
		}
		a.running++
		j.guard.watch(p.pid)
		a.ev.emit("rank_start", "attempt", a.n, "rank", p.spec.Rank, "pid", p.pid)
		go func(p *proc) {
			err := p.cmd.Wait()
			a.exits <- exitMsg{rank: p.spec.Rank, state: p.cmd.ProcessState, err: err, end: time.Now()}
		}(p)
	}
	j.writeJobRecord(a.dir, a.procs, a.url, a.env, a.began, a.ev)

	var checkC <-chan time.Time
	if j.HangAfter > 0 && j.NodeRank == 0 {
		t := time.NewTicker(hangCheckEvery)
		defer t.Stop()
		checkC = t.C
	}
	done := ctx.Done()
	for a.running > 0 {
		select {
		case m := <-a.exits:
			a.onExit(m)
		case m := <-a.pl.remote:
			a.onRemote(m)
		case n := <-a.pl.notices:
			a.onNotice(n)
		case now := <-checkC:
			a.onHangCheck(now)
		case <-a.hangC:
			a.hangC = nil
			a.teardown(OutcomeHang, a.hangWhy)
		case err := <-a.pl.fatal:
			a.onFatal(err)
		case <-a.pl.joins:
			if len(a.early) > 0 {
				a.judgeEarly(time.Now())
			}
		case now := <-a.earlyC:
			a.earlyC = nil
			a.judgeEarly(now)
		case <-timeoutC:
			timeoutC = nil
			a.pl.tell(nodeMsg{Kind: "teardown", Attempt: a.n, Reason: OutcomeTimeout.String(), TimeMS: time.Now().UnixMilli()})
			a.teardown(OutcomeTimeout, fmt.Sprintf("the job timed out after %v", j.Timeout))
		case <-done:
			done = nil
			a.pl.tell(nodeMsg{Kind: "teardown", Attempt: a.n, Reason: OutcomeInterrupted.String(), TimeMS: time.Now().UnixMilli()})
			a.teardown(OutcomeInterrupted, "the launcher was interrupted")
		case <-a.termC:
			a.termC, a.termAt = nil, time.Now()
			a.signalAll(syscall.SIGTERM)
			// A stopped rank (SIGSTOP, Ctrl-Z) would hold SIGTERM until resumed.
			a.signalAll(syscall.SIGCONT)
			a.killC = time.After(j.Grace)
		case <-a.killC:
			a.killC, a.killAt = nil, time.Now()
			a.ev.emit("sigkill", "ranks_left", a.running)
			a.signalAll(syscall.SIGKILL)
		}
	}
	// No orphans: whatever a rank left behind goes too, in its group or not.
	a.signalAll(syscall.SIGKILL)
	if n := killTagged(j.tag); n > 0 {
		a.ev.emit("orphans_killed", "attempt", a.n, "processes", n)
	}
	for _, p := range a.procs {
		for _, c := range p.flushes {
			c.Close()
		}
		for _, f := range p.files {
			f.Close()
		}
	}
	// With several nodes, another node's earlier failure may still be on its way.
	if j.nnodes > 1 && (a.outcome == OutcomeRankFailed || a.outcome == OutcomeHang) {
		settle := time.After(300 * time.Millisecond)
	drain:
		for {
			select {
			case m := <-a.pl.remote:
				if m.Attempt == a.n && (m.Kind == "rank_failed" || m.Kind == "hang") {
					a.failed(m.rootCause())
				}
			case <-settle:
				break drain
			}
		}
	}
}

// drainExits handles the exits already reported, without waiting.
func (a *attempt) drainExits() {
	for {
		select {
		case m := <-a.exits:
			a.onExit(m)
		default:
			return
		}
	}
}

// signalAll signals every rank's process group: the rank and every process
// it started.
func (a *attempt) signalAll(sig syscall.Signal) {
	for _, p := range a.procs {
		if p.pid > 0 {
			syscall.Kill(-p.pid, sig)
		}
	}
}

// teardown ends the attempt for outcome o: every rank still running is a
// victim; peers blocked in a collective fail at once naming detail, then
// SIGTERM, then SIGKILL after --grace.
func (a *attempt) teardown(o Outcome, detail string) {
	if a.tearing {
		return
	}
	a.tearing, a.outcome, a.tearAt = true, o, time.Now()
	for _, p := range a.procs {
		if !p.done && (a.root == nil || p.spec.Rank != a.root.Rank || a.root.Node != a.j.NodeRank) {
			a.victims = append(a.victims, p.spec.Rank)
			if st := processState(p.pid); strings.HasPrefix(st, "T") {
				a.stoppedStates[p.spec.Rank] = st
			}
		}
	}
	a.ev.emit("teardown", "attempt", a.n, "reason", o, "detail", detail, "victims", a.victims, "grace_ms", a.j.Grace.Milliseconds())
	if err := a.pl.abort(detail); err != nil {
		a.ev.emit("error", "error", "abort broadcast: "+err.Error())
	}
	a.termC = time.After(abortSettle)
}

// failed records a failure; the first one (across nodes, by time) is the
// root cause.
func (a *attempt) failed(rc RootCause) {
	if a.root == nil || rc.TimeMS < a.root.TimeMS {
		a.root = &rc
	}
}

func (a *attempt) onStartFailed(p *proc, err error) {
	now := time.Now()
	p.out.ExitCode, p.out.Error, p.out.EndMS = ExitStartFailed, err.Error(), now.UnixMilli()
	a.ev.emit("rank_start_failed", "attempt", a.n, "rank", p.spec.Rank, "error", err.Error())
	a.say("rank %d did not start: %v", p.spec.Rank, err)
	a.failed(RootCause{Rank: p.spec.Rank, Node: a.j.NodeRank, ExitCode: ExitStartFailed, TimeMS: now.UnixMilli(), Error: err.Error()})
	a.pl.tell(nodeMsg{Kind: "rank_failed", Attempt: a.n, Rank: p.spec.Rank, ExitCode: ExitStartFailed, TimeMS: now.UnixMilli()})
	a.teardown(OutcomeRankFailed, fmt.Sprintf("rank %d (node %d) did not start", p.spec.Rank, a.j.NodeRank))
}

func (a *attempt) onExit(m exitMsg) {
	a.running--
	p := a.byRank[m.rank]
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
	// A Go runtime that crashed exits 2 after its report (or dies by
	// SIGABRT after it, with GOTRACEBACK=crash).
	if p.out.ExitCode == 2 && p.out.Signal == "" || p.out.Signal == "SIGABRT" {
		if c := p.crash.Report(); c != nil {
			p.crashed = c
			p.out.Crash, p.out.Error = c.Kind, c.Line
		}
	}
	a.ev.emit("rank_exit", "attempt", a.n, "rank", m.rank, "pid", p.pid, "exit_code", p.out.ExitCode, "signal", p.out.Signal,
		"crash", p.out.Crash, "duration_ms", p.out.DurationMS)
	if a.tearing {
		return
	}
	if p.out.ExitCode == 0 {
		a.onCleanExit(p)
		return
	}
	rc := a.causeOf(p)
	a.failed(rc)
	a.pl.tell(nodeMsg{Kind: "rank_failed", Attempt: a.n, Rank: m.rank, ExitCode: rc.ExitCode, Signal: rc.Signal, TimeMS: rc.TimeMS,
		Crash: rc.Crash, Reason: crashLine(rc), Stack: rc.Stack})
	how := rc.How()
	if rc.Crash != "" {
		how += ": " + rc.Error
	}
	a.say("rank %d (node %d, pid %d) %s: tearing the job down", m.rank, a.j.NodeRank, p.pid, how)
	a.teardown(OutcomeRankFailed, fmt.Sprintf("rank %d (node %d) %s", m.rank, a.j.NodeRank, how))
}

// causeOf is the root cause that p, a rank of this node that ended, is: its
// exit code and signal, or the crash its stderr reported, with the
// launcher's code for it.
func (a *attempt) causeOf(p *proc) RootCause {
	rc := RootCause{Rank: p.spec.Rank, Node: a.j.NodeRank, ExitCode: p.out.ExitCode, Signal: p.out.Signal, TimeMS: p.out.EndMS}
	if c := p.crashed; c != nil {
		rc.Crash, rc.Error, rc.Stack = c.Kind, c.Line, c.Stack
		if rc.Signal == "" { // the runtime exited 2 itself
			rc.ExitCode, rc.Signal = c.ExitCode(), c.Signal
		}
	}
	return rc
}

// crashLine is a crashed root cause's line, for the other nodes.
func crashLine(rc RootCause) string {
	if rc.Crash == "" {
		return ""
	}
	return rc.Error
}

func (a *attempt) onRemote(m nodeMsg) {
	a.ev.emit("remote_"+m.Kind, "attempt", m.Attempt, "node", m.Node, "rank", m.Rank, "exit_code", m.ExitCode, "signal", m.Signal, "time_ms", m.TimeMS, "reason", m.Reason)
	if m.Attempt != a.n {
		return // a message about another attempt, late or early
	}
	switch m.Kind {
	case "rank_failed":
		a.remoteFails[m.Rank] = m.rootCause()
		a.failed(m.rootCause())
		if !a.tearing {
			a.say("rank %d on node %d failed (exit %d): tearing this node's ranks down", m.Rank, m.Node, m.ExitCode)
		}
		a.teardown(OutcomeRankFailed, fmt.Sprintf("rank %d (node %d) failed with exit code %d", m.Rank, m.Node, m.ExitCode))
	case "hang":
		a.remoteFails[m.Rank] = m.rootCause()
		a.failed(m.rootCause())
		if !a.tearing {
			a.say("node %d found rank %d hung: %s", m.Node, m.Rank, m.Reason)
		}
		a.teardown(OutcomeHang, fmt.Sprintf("rank %d hung: %s", m.Rank, m.Reason))
	case "teardown":
		var o Outcome
		if o.UnmarshalText([]byte(m.Reason)) != nil {
			o = OutcomeFatal
		}
		if o == OutcomeFatal && a.fatalErr == nil {
			a.fatalErr = fmt.Errorf("node %d: %s", m.Node, m.Detail)
		}
		a.teardown(o, fmt.Sprintf("node %d ended the job: %s", m.Node, m.Reason))
	}
}

func (a *attempt) onNotice(n protocol.Notice) {
	if a.notice != nil || n.Abort || n.Code == protocol.CodePeerClosed {
		return
	}
	a.notice = &NoticeReport{TimeMS: time.Now().UnixMilli(), Code: n.Code, Culprit: n.Rank, Reporter: n.Reporter,
		Op: n.Op, Seq: n.Seq, Group: n.Group, Detail: n.Detail}
	a.ev.emit("collective_failure", "attempt", a.n, "code", n.Code, "culprit_rank", n.Rank, "reporter_rank", n.Reporter, "op", n.Op, "seq", n.Seq, "group", n.Group, "detail", n.Detail)
	where := ""
	if n.Op != "" {
		where = fmt.Sprintf(" in %s seq %d on group %s", n.Op, n.Seq, n.Group)
	}
	a.say("rank %d reports %s%s, blaming rank %d: %s", n.Reporter, n.Code, where, n.Rank, n.Detail)
}

// onHangCheck looks for collectives waited in for --hang-after that some
// rank never entered: it names them, asks every rank for its stacks, and
// tears the job down with the first missing rank as the root cause.
func (a *attempt) onHangCheck(now time.Time) {
	for _, h := range a.pl.hangs(now, a.j.HangAfter) {
		key := fmt.Sprintf("%s/%d", h.Group, h.Seq)
		if a.reported[key] {
			continue
		}
		a.reported[key] = true
		hr := HangReport{TimeMS: now.UnixMilli(), Op: h.Op, Seq: h.Seq, Group: h.Group, Waiting: h.Waiting, Missing: h.Missing,
			WaitingMS: now.Sub(h.Since).Milliseconds(), States: map[string]string{}}
		var about []string
		for _, r := range h.Missing {
			what := fmt.Sprintf("rank %d", r)
			if p := a.byRank[r]; p != nil && !p.done {
				if st := processState(p.pid); st != "" {
					hr.States[strconv.Itoa(r)] = st
					what += " (pid " + strconv.Itoa(p.pid) + ", " + st + ")"
				}
			}
			if t, ok := a.pl.lastBeat(r); ok {
				what += fmt.Sprintf(", last heartbeat %.1f s ago", now.Sub(t).Seconds())
			}
			about = append(about, what)
		}
		a.hangs = append(a.hangs, hr)
		a.ev.emit("hang", "attempt", a.n, "op", h.Op, "seq", h.Seq, "group", h.Group, "waiting", h.Waiting, "missing", h.Missing,
			"waiting_ms", hr.WaitingMS, "process_states", hr.States)
		a.say("hang: %s seq %d on group %s: ranks %s waiting %.1f s; missing: %s", h.Op, h.Seq, h.Group,
			FormatRanks(h.Waiting), float64(hr.WaitingMS)/1000, strings.Join(about, "; "))
		var asked []int
		for _, p := range a.procs {
			if !p.done && p.stacks.Load() {
				syscall.Kill(p.pid, syscall.SIGUSR1)
				asked = append(asked, p.spec.Rank)
			}
		}
		if len(asked) > 0 {
			a.ev.emit("stacks_requested", "ranks", asked)
			a.say("goroutine stacks requested from ranks %s (rank-NNNNN/%s*.txt; a stopped rank writes its own when it resumes)",
				FormatRanks(asked), runlog.StacksPrefix)
		}
		if a.tearing || a.hangC != nil {
			continue
		}
		r := h.Missing[0]
		who := "never entered"
		if len(h.Missing) > 1 {
			who = fmt.Sprintf("(with ranks %s) never entered", FormatRanks(h.Missing))
		}
		why := fmt.Sprintf("%s %s seq %d on group %s, which ranks %s waited in for %.1f s", who, h.Op, h.Seq, h.Group,
			FormatRanks(h.Waiting), float64(hr.WaitingMS)/1000)
		if st := hr.States[strconv.Itoa(r)]; st != "" {
			why += "; its process was " + st
		}
		a.failed(RootCause{Rank: r, Node: a.j.nodeOf(r), ExitCode: ExitHang, TimeMS: now.UnixMilli(), Hung: true, Error: why})
		a.pl.tell(nodeMsg{Kind: "hang", Attempt: a.n, Rank: r, ExitCode: ExitHang, TimeMS: now.UnixMilli(), Reason: why})
		a.hangWhy = fmt.Sprintf("rank %d hung: %s", r, why)
		a.hangC = time.After(hangStacksSettle)
	}
}

func (a *attempt) onFatal(err error) {
	if a.tearing {
		return
	}
	a.fatal(err)
	a.pl.tell(nodeMsg{Kind: "teardown", Attempt: a.n, Reason: OutcomeFatal.String(), Detail: err.Error(), TimeMS: time.Now().UnixMilli()})
}

// fatal ends the attempt for a problem of the job as a whole.
func (a *attempt) fatal(err error) {
	a.fatalErr = err
	a.say("%v: tearing the job down", err)
	a.teardown(OutcomeFatal, err.Error())
}

// blameStuck makes a rank that never entered a collective the root cause
// when the first failure is a peer's collective timing out waiting for it:
// the waiting rank failed only because of it.
func (a *attempt) blameStuck() {
	n := a.notice
	if a.outcome != OutcomeRankFailed || a.root == nil || n == nil || n.Code != protocol.CodeTimeout ||
		n.Culprit < 0 || n.Culprit == a.root.Rank {
		return
	}
	c := n.Culprit
	if a.j.nodeOf(c) == a.j.NodeRank && !slices.Contains(a.victims, c) {
		return // it ended by itself: not stuck
	}
	rep := a.root.Rank
	where := ""
	if n.Op != "" {
		where = fmt.Sprintf(" %s seq %d on group %s", n.Op, n.Seq, n.Group)
	}
	a.root = &RootCause{Rank: c, Node: a.j.nodeOf(c), ExitCode: ExitHang, TimeMS: a.root.TimeMS, Hung: true, ReportedBy: &rep,
		Error: fmt.Sprintf("never entered%s; rank %d timed out waiting for it: %s", where, rep, n.Detail), Evidence: evidenceTimeout}
	a.outcome = OutcomeHang
	a.victims = slices.DeleteFunc(a.victims, func(r int) bool { return r == c })
	if a.j.nodeOf(rep) == a.j.NodeRank && !slices.Contains(a.victims, rep) {
		a.victims = append(a.victims, rep)
		slices.Sort(a.victims)
	}
}

// summary is how the attempt ended.
func (a *attempt) summary() AttemptSummary {
	if a.root != nil && a.root.Node == a.j.NodeRank && !a.root.Hung {
		// A crash's own line (a.root.Error) is what ended the rank, whatever
		// it recorded before.
		if rec, ok := logview.ReadErrorFile(filepath.Join(a.dir, RankDir(a.root.Rank))); ok {
			a.root.Culprit = rec.Culprit
			if a.root.Crash == "" {
				a.root.Error = rec.Error
			}
		} else if msg := torchError(filepath.Join(a.dir, RankDir(a.root.Rank), TorchErrorFile)); msg != "" && a.root.Crash == "" {
			a.root.Error = msg
		}
	}
	a.blameStuck()
	a.blameByVotes()
	if a.root != nil && a.root.Evidence == "" {
		a.root.Evidence = evidenceFirst
		if a.root.Hung {
			a.root.Evidence = evidenceHang
		}
	}
	rel, _ := filepath.Rel(a.j.dir, a.dir)
	s := AttemptSummary{Attempt: a.n, Dir: rel, Reason: a.outcome, Victims: a.victims, Notice: a.notice, Hangs: a.hangs,
		DurationMS: time.Since(a.began).Milliseconds()}
	if s.Victims == nil {
		s.Victims = []int{}
	}
	if a.fatalErr != nil {
		s.Error = a.fatalErr.Error()
	}
	code := 0
	if a.root != nil && (a.outcome == OutcomeRankFailed || a.outcome == OutcomeHang) {
		rc := a.root.Rank
		s.RootCauseRank, s.RootCause = &rc, a.root
		code = exitCodeOf(a.root)
	}
	s.ExitCode = outcomeExitCode(a.outcome, code)
	for _, p := range a.procs {
		p.out.LogLinesDropped = 0
		for _, c := range p.flushes {
			if w, ok := c.(*rankWriter); ok {
				p.out.LogLinesDropped += w.dropped.Load()
			}
		}
		s.Ranks = append(s.Ranks, p.out)
	}
	if s.Ranks == nil {
		s.Ranks = []RankOutcome{}
	}
	return s
}

// err explains how the attempt ended; nil when every rank exited 0.
func (a *attempt) err() error {
	logs := a.dir
	restarts := ""
	if a.n > 0 {
		restarts = fmt.Sprintf(" (attempt %d, after %d restarts)", a.n, a.n)
	}
	rc := a.root
	where := func() string {
		w := fmt.Sprintf("node %d", rc.Node)
		if p := a.byRank[rc.Rank]; p != nil && rc.Node == a.j.NodeRank && p.pid > 0 {
			w += fmt.Sprintf(", pid %d", p.pid)
		}
		return w
	}
	switch a.outcome {
	case OutcomeRankFailed:
		how := rc.How()
		if rc.ExitCode == ExitStartFailed && rc.Error != "" && rc.Crash == "" {
			how = "did not start: " + rc.Error
		}
		if rc.ExitCode == 0 && rc.Error != "" {
			how = rc.Error
		}
		blame := ""
		if rc.Culprit != nil && *rc.Culprit != rc.Rank {
			blame = fmt.Sprintf(" (its error blames rank %d)", *rc.Culprit)
		}
		if rc.ReportedBy != nil {
			blame += fmt.Sprintf(" (%s; rank %d failed first)", rc.Evidence, *rc.ReportedBy)
		}
		if rc.Crash != "" {
			blame = fmt.Sprintf(" (%s)", rc.Error) + blame
		}
		return fmt.Errorf("%w: root cause rank %d (%s) %s at %s%s; %d other ranks torn down%s; logs in %s",
			ErrRankFailed, rc.Rank, where(), how, time.UnixMilli(rc.TimeMS).Format(consoleStamp), blame, len(a.victims), restarts, logs)
	case OutcomeHang:
		return fmt.Errorf("%w: root cause rank %d (%s) %s; %d other ranks torn down%s; logs in %s",
			ErrHang, rc.Rank, where(), rc.Error, len(a.victims), restarts, logs)
	case OutcomeTimeout:
		return fmt.Errorf("timed out after %v; %d ranks torn down%s; logs in %s", a.j.Timeout, len(a.victims), restarts, logs)
	case OutcomeInterrupted:
		return fmt.Errorf("interrupted; %d ranks torn down%s; logs in %s", len(a.victims), restarts, logs)
	case OutcomeFatal:
		return fmt.Errorf("%v; %d ranks torn down%s; logs in %s", a.fatalErr, len(a.victims), restarts, logs)
	}
	return nil
}
