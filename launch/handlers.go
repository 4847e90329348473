package launch

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/launch/probe"
	"github.com/meshrun/meshrun/protocol"
	"github.com/meshrun/meshrun/runlog"
)

// The attempt's handlers of what happens to its ranks: a rank that could not
// start or exited, another node's report, a collective's failure notice, a
// hang found in the heartbeats, a problem of the job as a whole.

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
	if e := probe.PythonException(p.dir); e != nil && p.crashed == nil {
		rc.Exception = e.Type
		if e.Message != "" {
			rc.Exception += ": " + e.Message
		}
		if e.User != nil {
			rc.Where = fmt.Sprintf("%s (%s:%d)", e.User.Func, filepath.Base(e.User.File), e.User.Line)
		}
	}
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
// tears the job down with a missing rank as the root cause (hangCulprit).
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
				if st := probe.ProcessState(p.pid); st != "" {
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
			a.stacksAt = now
			a.ev.emit("stacks_requested", "ranks", asked)
			a.say("goroutine stacks requested from ranks %s (rank-NNNNN/%s*.txt; a stopped rank writes its own when it resumes)",
				FormatRanks(asked), runlog.StacksPrefix)
		}
		if a.tearing || a.hangC != nil {
			continue
		}
		r := hangCulprit(h.Missing, hr.States)
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

// hangCulprit is the root cause among the ranks missing from a collective:
// the first whose process is stopped (state T or t: SIGSTOP, a debugger),
// which the others, asleep waiting, may be waiting on (a pipeline's
// neighbours wait for the stopped stage, and a collective after the step
// finds them missing too); else the first.
func hangCulprit(missing []int, states map[string]string) int {
	for _, r := range missing {
		if st := states[strconv.Itoa(r)]; strings.HasPrefix(st, "T") || strings.HasPrefix(st, "t") {
			return r
		}
	}
	return missing[0]
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
