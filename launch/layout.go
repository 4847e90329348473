package launch

import "github.com/meshrun/meshrun/logview"

// The job folder the launcher writes, runs/<job-id>/, is laid out and typed
// in package logview, which reads it back (launcher logs, logs why, trace):
// these are its names here.

// Files of a job folder.
const (
	JobFile     = logview.JobFile
	EventsFile  = logview.EventsFile
	SummaryFile = logview.SummaryFile
	CredsFile   = logview.CredsFile
)

// job.json's and summary.json's types.
type (
	JobRecord      = logview.JobRecord
	RankRecord     = logview.RankRecord
	Summary        = logview.Summary
	AttemptSummary = logview.AttemptSummary
	RootCause      = logview.RootCause
	NoticeReport   = logview.NoticeReport
	HangReport     = logview.HangReport
	RankOutcome    = logview.RankOutcome
)

// ExitCrash is the launcher's exit code for a root cause whose Go runtime
// crashed with no signal behind the crash (logview.ExitCrash).
const ExitCrash = logview.ExitCrash

// RankDir is the folder of one rank inside the job folder: rank-00003.
func RankDir(rank int) string { return logview.RankDir(rank) }

// AttemptDir is the folder, in the job's, of attempt n > 0.
func AttemptDir(n int) string { return logview.AttemptDir(n) }

// Attempts lists a job's attempts by the folders they left (logview.Attempts).
func Attempts(jobDir string) []int { return logview.Attempts(jobDir) }

// FormatRanks renders ranks compactly: [0 1 2 3 5 7 8] -> "0-3,5,7-8".
func FormatRanks(ranks []int) string { return logview.FormatRanks(ranks) }

// ParseRanks reads "0,4-7" into a set of ranks.
func ParseRanks(s string) (map[int]bool, error) { return logview.ParseRanks(s) }

// consoleStamp is the console's time layout: the time of day.
const consoleStamp = logview.ConsoleStamp

// collapseWindow is how long the console holds a line to see whether other
// ranks print the same one (logview.CollapseWindow).
const collapseWindow = logview.CollapseWindow
