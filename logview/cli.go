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
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/meshrun/meshrun/internal/flaghelp"
)

// ExitUsage is the exit code for bad flags (the launcher's, as every one of
// its commands).
const ExitUsage = 2

// jobArgs parses the command line of command cmd (as "launcher trace"),
// which reads one job's folder: [JOB|latest] with --log-dir, --attempt
// (attemptUsage its usage) and the flags already on fs, usage its -h's head;
// it returns the job's folder under --log-dir and the attempt (-1 the
// last). When ok is false the command is over with exit code code: its -h
// written to stdout, or its problem to stderr.
func jobArgs(cmd, usage string, fs *flag.FlagSet, attemptUsage string, args []string, stdout, stderr io.Writer) (dir string, attempt, code int, ok bool) {
	fs.SetOutput(io.Discard)
	logDir := fs.String("log-dir", "runs", "`DIR` holding the jobs' folders")
	att := fs.Int("attempt", -1, attemptUsage)
	pos, err := flaghelp.Interspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, flaghelp.Help(usage, fs))
		return "", 0, 0, false
	}
	if err != nil {
		err = flaghelp.CommandError(cmd, fs, err)
	} else if len(pos) > 1 {
		err = fmt.Errorf("one job at most, got %q", pos)
	} else if *att < -1 {
		err = fmt.Errorf("--attempt %d: want 0 or more", *att)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return "", 0, ExitUsage, false
	}
	job := ""
	if len(pos) == 1 {
		job = pos[0]
	}
	if dir, err = ResolveJob(*logDir, job); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return "", 0, 1, false
	}
	return dir, *att, 0, true
}

// problems collects every problem with a command's flags, shown in one line.
type problems []string

func (p problems) Error() string { return strings.Join(p, "; ") }
