package launch

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/logview"
	"github.com/meshrun/meshrun/protocol"
)

// The root cause of a failed attempt is decided from evidence, not from
// which exit the launcher happened to see first:
//
//  1. a rank that never entered a collective its peers waited in (a hang the
//     launcher found in the heartbeats, or the rank a peer's collective timed
//     out waiting for) — blameStuck;
//  2. else the rank the failed ranks' errors blame (each error.json's
//     culprit_rank other than the rank itself, and the collectives' failure
//     notice): the rank most of them name, when more blame it than blame the
//     first failure — blameByVotes. A SIGTERMed rank whose peers see it go
//     and exit first is the root cause, not the first peer to exit;
//  3. else the first failure by time, across nodes.
//
// RootCause.Evidence says which.

// Evidence values of RootCause (logview's: logs why reads them).
const (
	evidenceFirst   = logview.EvidenceFirst
	evidenceHang    = logview.EvidenceHang
	evidenceTimeout = logview.EvidenceTimeout
	evidenceBlamed  = logview.EvidenceBlamed
	evidenceEarly   = logview.EvidenceEarly
)

// votes counts the ranks that the failed ranks of this node blame in their
// errors (error.json's culprit_rank, not themselves), and the culprit of the
// collectives' failure notice; by whom.
func (a *attempt) votes() map[int][]int {
	by := map[int][]int{}
	for _, p := range a.procs {
		if p.out.ExitCode == 0 && p.out.Signal == "" {
			continue
		}
		rec, ok := logview.ReadErrorFile(filepath.Join(a.dir, RankDir(p.spec.Rank)))
		if !ok || rec.Culprit == nil || *rec.Culprit == p.spec.Rank || *rec.Culprit < 0 || *rec.Culprit >= a.j.world {
			continue
		}
		by[*rec.Culprit] = append(by[*rec.Culprit], p.spec.Rank)
	}
	if n := a.notice; n != nil && n.Culprit >= 0 && n.Culprit < a.j.world && n.Culprit != n.Reporter && !slices.Contains(by[n.Culprit], n.Reporter) {
		by[n.Culprit] = append(by[n.Culprit], n.Reporter)
	}
	for _, v := range by {
		slices.Sort(v)
	}
	return by
}

// blameByVotes makes the rank the failed ranks' errors blame the root cause,
// when more of them blame it than blame the first failure (ties: the lowest
// rank, so that every run gives the same answer).
func (a *attempt) blameByVotes() {
	if a.root == nil || a.root.Hung || (a.outcome != OutcomeRankFailed && a.outcome != OutcomeHang) {
		return
	}
	by := a.votes()
	winner := -1
	for r, v := range by {
		if winner < 0 || len(v) > len(by[winner]) || (len(v) == len(by[winner]) && r < winner) {
			winner = r
		}
	}
	if winner < 0 || winner == a.root.Rank || len(by[winner]) <= len(by[a.root.Rank]) {
		return
	}
	first := a.root.Rank
	rc := RootCause{Rank: winner, Node: a.j.nodeOf(winner), TimeMS: a.root.TimeMS, ReportedBy: &first,
		Evidence: fmt.Sprintf("%s (%s)", evidenceBlamed, blamers(by[winner]))}
	p := a.byRank[winner]
	rec, hasRec := logview.ReadErrorFile(filepath.Join(a.dir, RankDir(winner)))
	// A victim that recorded a failure of its own before the teardown began
	// was failing already, and only slow to exit: a SIGTERM from outside,
	// say, which its peers saw first (its error blames itself), or an error
	// of its own (blaming no one). What it records later is the teardown's
	// doing (the abort blames another rank or none) or its peers' verdict
	// come back to it: a rank SIGCONTed after its peers gave up on it
	// learns from their notice that it is lost, and its error blames itself.
	selfFailed := hasRec && rec.TimeMS > 0 && rec.TimeMS < a.tearAt.UnixMilli() &&
		(rec.Culprit == nil || *rec.Culprit == winner)
	// So was one whose end was its own, whenever it came: its Go runtime
	// crashed, or a signal the teardown had not sent killed it (SIGKILL
	// from outside, SIGSEGV).
	selfFailed = selfFailed || p != nil && a.endedByItself(p)
	switch {
	case p != nil && slices.Contains(a.victims, winner) && !selfFailed:
		// Blamed, and still running when the job was torn down: it stopped
		// answering (stopped, or stuck outside any collective).
		rc.Hung, rc.ExitCode = true, ExitHang
		what := "stopped answering its peers"
		if _, joined := a.pl.joined(winner); !joined {
			what = "never joined the job"
		}
		rc.Error = fmt.Sprintf("%s (%s) and was still running at teardown", what, blamers(by[winner]))
		if st := a.stoppedStates[winner]; st != "" {
			rc.Error += "; its process was " + st
		}
		a.outcome = OutcomeHang
		a.victims = slices.DeleteFunc(a.victims, func(r int) bool { return r == winner })
	case p != nil:
		own := a.causeOf(p)
		rc.ExitCode, rc.Signal, rc.TimeMS, rc.Crash, rc.Stack = own.ExitCode, own.Signal, own.TimeMS, own.Crash, own.Stack
		if hasRec {
			rc.Error, rc.Culprit, rc.TimeMS = rec.Error, rec.Culprit, rec.TimeMS
		}
		if own.Crash != "" {
			rc.Error = own.Error
		}
		a.victims = slices.DeleteFunc(a.victims, func(r int) bool { return r == winner })
		if rc.ExitCode == 0 && rc.Signal == "" {
			rc.Error = strings.TrimPrefix(rc.Error+"; ", "; ") + "exited 0 while its peers still needed it"
		}
	default:
		if r, ok := a.remoteFails[winner]; ok {
			rc.ExitCode, rc.Signal, rc.TimeMS, rc.Hung, rc.Error = r.ExitCode, r.Signal, r.TimeMS, r.Hung, r.Error
			rc.Crash, rc.Stack = r.Crash, r.Stack
		} else {
			// No word of it from its node's launcher either: as far as this
			// node can tell, it stopped answering (a partition, a stopped
			// node).
			rc.Hung, rc.ExitCode = true, ExitHang
			rc.Error = fmt.Sprintf("stopped answering (%s); node %d's launcher sent no word of it", blamers(by[winner]), rc.Node)
			a.outcome = OutcomeHang
		}
	}
	a.root = &rc
	if a.j.nodeOf(first) == a.j.NodeRank && !slices.Contains(a.victims, first) {
		a.victims = append(a.victims, first)
		slices.Sort(a.victims)
	}
}

// endedByItself reports whether p ended by itself, not by the teardown's
// signals: its Go runtime crashed (a report, then exit 2: the teardown's
// SIGTERM kills a rank or makes it exit 143, never that), a signal killed
// it that the launcher does not send (SIGSEGV, SIGABRT, ...) or had not sent
// by then (SIGTERM, SIGKILL), or it exited 128+SIGTERM or 128+SIGINT, as the
// worker does on those signals, before the teardown sent any: a signal from
// outside, which its peers may have seen (and failed on) before the
// launcher saw its exit.
func (a *attempt) endedByItself(p *proc) bool {
	if !p.done {
		return false
	}
	switch p.out.Signal {
	case "":
		if c := p.out.ExitCode; c == 128+int(syscall.SIGTERM) || c == 128+int(syscall.SIGINT) {
			return a.termAt.IsZero() || p.out.EndMS < a.termAt.UnixMilli()
		}
		return p.crashed != nil
	case "SIGKILL":
		return a.killAt.IsZero() || p.out.EndMS < a.killAt.UnixMilli()
	case "SIGTERM":
		return a.termAt.IsZero() || p.out.EndMS < a.termAt.UnixMilli()
	}
	return true
}

// exitCodeOf is the launcher's exit code for a root cause: its own, or 1 for
// a rank that exited 0 but failed the job.
func exitCodeOf(rc *RootCause) int {
	if rc.ExitCode == 0 {
		return 1
	}
	return rc.ExitCode
}

// earlySettle is how long after a rank's exit 0 the launcher waits for its
// last messages (a heartbeat sent just before it exited) before judging it.
const earlySettle = 500 * time.Millisecond

// onCleanExit is a rank's exit 0 while the attempt runs: a finished rank, or
// one that left before joining the job its peers are joining (judgeEarly).
func (a *attempt) onCleanExit(p *proc) {
	if a.early == nil {
		a.early = map[int]int64{}
	}
	a.early[p.spec.Rank] = p.out.EndMS
	a.earlyC = time.After(earlySettle)
}

// judgeEarly fails the attempt for the first rank that exited 0 without
// having joined (no heartbeat) when it said it was joining, or when other
// ranks are joining the job (so it is one of them that left): its peers
// would wait for it until the rendezvous deadline.
func (a *attempt) judgeEarly(now time.Time) {
	if a.tearing {
		return
	}
	first, firstMS, why := -1, int64(0), ""
	for r, endMS := range a.early {
		if now.Sub(time.UnixMilli(endMS)) < earlySettle {
			a.earlyC = time.After(earlySettle) // judge it later
			continue
		}
		joining, joined := a.pl.joined(r)
		var w string
		switch {
		case joined:
			delete(a.early, r) // it finished its work
			continue
		case joining:
			w = "exited 0 during the rendezvous: it never completed joining the job"
		default:
			others := slices.DeleteFunc(a.pl.joiners(), func(o int) bool { return o == r })
			if len(others) == 0 {
				continue // nobody joins (a program without meshrun's collectives), yet
			}
			w = fmt.Sprintf("exited 0 without joining the job; ranks %s are joining it and would wait for it", FormatRanks(others))
		}
		if first < 0 || endMS < firstMS || (endMS == firstMS && r < first) {
			first, firstMS, why = r, endMS, w
		}
	}
	if first < 0 {
		return
	}
	rc := RootCause{Rank: first, Node: a.j.NodeRank, ExitCode: 0, TimeMS: firstMS, Error: why, Evidence: evidenceEarly}
	a.failed(rc)
	a.pl.tell(nodeMsg{Kind: "rank_failed", Attempt: a.n, Rank: first, ExitCode: 0, TimeMS: firstMS, Reason: why})
	a.say("rank %d (node %d) %s: tearing the job down", first, a.j.NodeRank, why)
	a.teardown(OutcomeRankFailed, fmt.Sprintf("rank %d (node %d) %s", first, a.j.NodeRank, why))
}

// blamers says who blames a rank: "rank 0 blames it", "ranks 0,2 blame it".
func blamers(ranks []int) string {
	if len(ranks) == 1 {
		return fmt.Sprintf("rank %d blames it", ranks[0])
	}
	return fmt.Sprintf("ranks %s blame it", FormatRanks(ranks))
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
