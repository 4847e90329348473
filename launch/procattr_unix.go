//go:build unix && !linux

package launch

import "syscall"

// rankProcAttr puts a rank in its own process group, so teardown signals the
// rank and every process it started. Only Linux has a parent-death signal:
// elsewhere ranks outlive a launcher killed by SIGKILL.
func rankProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// rlimitNPROC: the process limit is not checked here (an invalid resource).
const rlimitNPROC = -1
