package launch

import "syscall"

// rankProcAttr puts a rank in its own process group, so teardown signals the
// rank and every process it started, and has the kernel kill the rank when the
// launcher dies, even by SIGKILL.
func rankProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// rlimitNPROC is Linux's RLIMIT_NPROC (the syscall package lacks it).
const rlimitNPROC = 6
