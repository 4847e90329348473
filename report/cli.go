package report

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/meshrun/meshrun/internal/exitcode"
	"github.com/meshrun/meshrun/internal/flaghelp"
	"github.com/meshrun/meshrun/logview"
)

const usage = `usage: launcher report [FLAGS] [JOB]
  one HTML page about a job (its folder under --log-dir, the newest by default):
  what ran and how it ended, the loss and step time per step of every attempt,
  each rank's step split into kernels, collectives and the rest, the bytes the
  collectives moved, one step across the ranks; self-contained, no script,
  readable offline; a running or failed job's folder reads as it is`

// Main runs `launcher report` with args and returns the exit code: 0 with
// the page written (its path on stdout), or one line "launcher report: ..."
// on stderr and exitcode.Usage.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	logDir := fs.String("log-dir", "runs", "the jobs' `DIR`")
	out := fs.String("o", "", "write the page to `FILE` (default: report.html in the job's folder)")
	// The job may come before the flags (launcher report JOB -o FILE).
	var job string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stdout, flaghelp.Help(usage, fs))
				return 0
			}
			fmt.Fprintf(stderr, "launcher report: %v\n", flaghelp.CommandError("launcher report", fs, err))
			return exitcode.Usage
		}
		if fs.NArg() == 0 {
			break
		}
		if job != "" {
			fmt.Fprintf(stderr, "launcher report: one job at a time, not %q and %q\n", job, fs.Arg(0))
			return exitcode.Usage
		}
		job, args = fs.Arg(0), fs.Args()[1:]
	}
	err := run(*logDir, job, *out, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "launcher report: %v\n", err)
		return exitcode.Usage
	}
	return 0
}

func run(logDir, job, out string, stdout io.Writer) error {
	dir := job
	if st, err := os.Stat(job); job == "" || err != nil || !st.IsDir() {
		var err error
		if dir, err = logview.ResolveJob(logDir, job); err != nil {
			return err
		}
	}
	j, err := Read(dir)
	if err != nil {
		return err
	}
	if out == "" {
		out = filepath.Join(dir, "report.html")
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := Write(f, j); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	fmt.Fprintln(stdout, out)
	return nil
}
