// Package exitcode holds the exit codes that more than one of the launcher's
// packages returns: launch (run, ckpt) and planview (plan) exit with them
// without importing each other; logview's ExitUsage (logs, trace) is the
// same code (launch's TestExitCodesShared checks).
package exitcode

const (
	// Usage is the exit code for bad flags and inputs that cannot be run.
	Usage = 2
	// Interrupted is the exit code when the launcher is interrupted (Ctrl-C
	// or SIGTERM) before it finished, as a shell's 128+SIGINT.
	Interrupted = 130
)
