package launch

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Before it starts anything, the launcher checks that this machine can hold
// the ranks it is asked for: a typo such as -n 10000 on a laptop is refused
// with the limit it hits (exit 2) instead of spawning thousands of processes.
// --oversubscribe goes past the limits knowingly.

const (
	// ranksPerCore bounds the ranks of a node per core this launcher may use.
	ranksPerCore = 64
	// filesPerRank is what the launcher holds open per rank: its stdout and
	// stderr pipes and log files, and spare.
	filesPerRank = 6
	// filesReserve is the launcher's own: NATS, events, the console.
	filesReserve = 64
	// workerFloor is a worker rank's least resident memory (a Go runtime, a
	// NATS connection, the logs): about 10 MiB measured for `worker sleep`,
	// doubled.
	workerFloor = 20 << 20
)

// hostLimits is what this machine gives the launcher.
type hostLimits struct {
	cores  int
	memory int64  // MemAvailable in bytes; 0 unknown
	files  uint64 // RLIMIT_NOFILE (soft); 0 unknown
	procs  uint64 // RLIMIT_NPROC (soft); 0 unknown
}

// readHostLimits reads them: cores from GOMAXPROCS, memory from
// /proc/meminfo, the limits from getrlimit.
func readHostLimits() hostLimits {
	l := hostLimits{cores: cores(), memory: memAvailable()}
	var r syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r) == nil && r.Cur != ^uint64(0) {
		l.files = r.Cur
	}
	if syscall.Getrlimit(rlimitNPROC, &r) == nil && r.Cur != ^uint64(0) {
		l.procs = r.Cur
	}
	return l
}

// memAvailable is /proc/meminfo's MemAvailable in bytes, 0 when unknown.
func memAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// resourceProblems says which of l's limits n ranks on this node exceed;
// workers: the ranks run the worker (whose least memory is known).
func resourceProblems(n int, workers bool, l hostLimits) []string {
	var p []string
	if max := ranksPerCore * max(l.cores, 1); n > max {
		p = append(p, fmt.Sprintf("%d ranks on %d cores is over %d per core (%d at most here)", n, l.cores, ranksPerCore, max))
	}
	if need := uint64(n)*filesPerRank + filesReserve; l.files > 0 && need > l.files {
		p = append(p, fmt.Sprintf("%d ranks need about %d open files, the limit is %d (ulimit -n)", n, need, l.files))
	}
	if l.procs > 0 && uint64(n) > l.procs/2 {
		p = append(p, fmt.Sprintf("%d ranks is over half the process limit, %d (ulimit -u)", n, l.procs))
	}
	if need := int64(n) * workerFloor; workers && l.memory > 0 && need > l.memory {
		p = append(p, fmt.Sprintf("%d worker ranks need at least %s of memory (%s each), %s is available", n, gib(need), gib(workerFloor), gib(l.memory)))
	}
	return p
}

// gib formats a byte count for people.
func gib(b int64) string {
	if b >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	}
	return fmt.Sprintf("%d MiB", b>>20)
}
