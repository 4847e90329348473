package launch

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/meshrun/meshrun/logview"
)

// Outcome is how an attempt of a job ended (summary.json's "reason", which
// logview reads).
type Outcome = logview.Outcome

// The outcomes of an attempt.
const (
	OutcomeOK          = logview.OutcomeOK
	OutcomeRankFailed  = logview.OutcomeRankFailed
	OutcomeHang        = logview.OutcomeHang
	OutcomeTimeout     = logview.OutcomeTimeout
	OutcomeInterrupted = logview.OutcomeInterrupted
	OutcomeFatal       = logview.OutcomeFatal
)

// restartable reports whether --max-restarts may run the job again after an
// attempt ended so: a rank's failure or a hang, not a timeout, an interrupt
// or a problem of the job as a whole.
func restartable(o Outcome) bool { return o == OutcomeRankFailed || o == OutcomeHang }

// ExitHang is the exit code of a job ended by a hang (OutcomeHang).
const ExitHang = 125

// outcomeExitCode is the launcher's exit code for an attempt that ended o;
// code is the root-cause rank's own exit code (OutcomeRankFailed).
func outcomeExitCode(o Outcome, code int) int {
	switch o {
	case OutcomeRankFailed:
		return code
	case OutcomeHang:
		return ExitHang
	case OutcomeTimeout:
		return ExitTimeout
	case OutcomeInterrupted:
		return ExitInterrupted
	case OutcomeFatal:
		return 1
	}
	return 0
}

// summary is how the attempt ended.
func (a *attempt) summary() AttemptSummary {
	a.blameFirstException()
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
			if w, ok := c.(*logview.RankWriter); ok {
				p.out.LogLinesDropped += w.Dropped()
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
