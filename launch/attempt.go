package launch

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/launch/probe"
	"github.com/meshrun/meshrun/logview"
)

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
	outCon, errCon *logview.Console
	board          *logview.ProgressBoard
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
	idleDone bool      // a foreign program's job was found idle (foreign.go)
	idleAt   time.Time // its last idle check
	stacksAt time.Time // when a hang's stacks were asked for
	hookDir  string    // the Python site hook's folder, removed at the end
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
	if _, _, workload := a.j.command(); !workload && os.Getenv(probe.EnvPythonHook) != "0" {
		// Python ranks load the launcher's site hook (foreign.go), from a
		// folder of its own that goes with the attempt.
		dir, err := os.MkdirTemp("", "meshrun-python-hook-")
		if err != nil {
			return fmt.Errorf("python site hook: %w", err)
		}
		a.hookDir = dir
		hook, err := probe.WritePythonHook(dir)
		if err != nil {
			return fmt.Errorf("python site hook: %w", err)
		}
		a.env["PYTHONPATH"] = probe.PythonPathWith(hook, os.Getenv("PYTHONPATH"))
	}
	a.board = logview.NewProgressBoard(a.outCon, len(a.j.ranks))
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
	_, _, workload := j.command()
	foreign := !workload && j.nnodes == 1
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
			if foreign {
				a.onIdleCheck(now)
			}
		case <-a.hangC:
			a.hangC = nil
			a.describeHang(a.stacksAt)
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
	if a.hookDir != "" {
		os.RemoveAll(a.hookDir)
	}
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
			if st := probe.ProcessState(p.pid); strings.HasPrefix(st, "T") {
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
