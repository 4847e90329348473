// Package logview is the launcher's view of a job's folder, for a job
// running or done: `launcher logs` (the ranks' logs merged by time),
// `launcher logs why` (the root cause, its error and last lines, the
// victims) and `launcher trace` (every rank's trace in one file). It holds
// what the launcher writes there and reads back: the folder's layout,
// job.json's and summary.json's types, the ranks' log lines and the console
// that shows them as they are written (console.go), and the reading of a Go
// runtime's crash report in a rank's stderr. The launcher (package launch)
// writes the folder with these; this package does not import it, so a view
// never depends on how the ranks are started and supervised.
package logview

import (
	"flag"
	"fmt"
	"strings"

	"github.com/meshrun/meshrun/internal/flaghelp"
)

// ExitUsage is the exit code for bad flags (the launcher's, as every one of
// its commands).
const ExitUsage = 2

// helpText is a command's -h: its usage lines, then every flag of fs with its
// default (from the FlagSet itself, so it cannot drift from the flags).
func helpText(head string, fs *flag.FlagSet) string {
	var b strings.Builder
	b.WriteString(head)
	b.WriteString("\nflags:\n")
	flaghelp.Flags(&b, fs)
	return b.String()
}

// flagError is a bad flag of command cmd (fs.Parse's error) as one line that
// names the flag and points at cmd -h.
func flagError(cmd string, fs *flag.FlagSet, err error) error {
	return fmt.Errorf("%v (%s -h lists the flags)", flaghelp.Error(fs, err), cmd)
}

// problems collects every problem with a command's flags, shown in one line.
type problems []string

func (p problems) Error() string { return strings.Join(p, "; ") }
