package launch

import "fmt"

// Outcome is how an attempt of a job ended. It reads and writes as a word in
// summary.json ("reason") and events.jsonl.
type Outcome int

const (
	// OutcomeOK: every rank exited 0.
	OutcomeOK Outcome = iota
	// OutcomeRankFailed: a rank exited non-zero, was killed, or did not start.
	OutcomeRankFailed
	// OutcomeHang: ranks waited in a collective that a rank never entered
	// (for --hang-after, or until the collective's own deadline failed them).
	OutcomeHang
	// OutcomeTimeout: --timeout ended the job.
	OutcomeTimeout
	// OutcomeInterrupted: the launcher was interrupted (Ctrl-C, SIGTERM).
	OutcomeInterrupted
	// OutcomeFatal: a problem of the job as a whole (the control plane's),
	// not of one rank.
	OutcomeFatal
)

var outcomeNames = [...]string{"ok", "rank_failed", "hang", "timeout", "interrupted", "fatal"}

func (o Outcome) String() string {
	if o < 0 || int(o) >= len(outcomeNames) {
		return fmt.Sprintf("outcome(%d)", int(o))
	}
	return outcomeNames[o]
}

// MarshalText writes the outcome's word.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText reads an outcome's word.
func (o *Outcome) UnmarshalText(b []byte) error {
	for i, n := range outcomeNames {
		if n == string(b) {
			*o = Outcome(i)
			return nil
		}
	}
	return fmt.Errorf("unknown outcome %q", b)
}

// restartable reports whether --max-restarts may run the job again after an
// attempt ended so: a rank's failure or a hang, not a timeout, an interrupt
// or a problem of the job as a whole.
func (o Outcome) restartable() bool { return o == OutcomeRankFailed || o == OutcomeHang }

// ExitHang is the exit code of a job ended by a hang (OutcomeHang).
const ExitHang = 125

// exitCode is the launcher's exit code for an attempt that ended so; code is
// the root-cause rank's own exit code (OutcomeRankFailed).
func (o Outcome) exitCode(code int) int {
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
