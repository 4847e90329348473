package logview

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
