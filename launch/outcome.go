package launch

import "github.com/meshrun/meshrun/logview"

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

// exitCode is the launcher's exit code for an attempt that ended so; code is
// the root-cause rank's own exit code (OutcomeRankFailed).
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
