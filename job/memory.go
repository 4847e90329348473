package job

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/tensor"
)

// EnvMemoryCheck, set to 0, skips the check of a workload's memory estimate
// against the memory this machine has available.
const EnvMemoryCheck = "MESHRUN_MEMORY_CHECK"

// memAvailable returns the bytes this machine can still give its processes:
// MemAvailable from /proc/meminfo, or the room left under the cgroup's memory
// limit when that is less. ok is false where it is not known (not Linux).
// Tests replace it.
var memAvailable = func() (n int64, ok bool) {
	if runtime.GOOS != "linux" {
		return 0, false
	}
	n, ok = meminfo("/proc/meminfo", "MemAvailable")
	if !ok {
		return 0, false
	}
	for _, f := range [][2]string{
		{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},                                 // cgroup v2
		{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}, // v1
	} {
		limit, ok1 := readInt(f[0])
		used, ok2 := readInt(f[1])
		if ok1 && ok2 && limit-used < n {
			n = max(limit-used, 0)
		}
	}
	return n, true
}

// meminfo reads one field of /proc/meminfo ("MemAvailable:  24099332 kB"), in
// bytes.
func meminfo(path, field string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 || kb > 1<<50 {
			return 0, false
		}
		return kb << 10, true
	}
	return 0, false
}

// readInt reads a file holding one decimal number ("max" or anything else:
// not ok).
func readInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil && n >= 0
}

// ranksHere is the number of ranks of the job that run on this machine: the
// launcher's LOCAL_WORLD_SIZE, or, for a worker run alone (its ranks in this
// process), all of them.
func ranksHere(env Env, world int) int {
	if n, err := strconv.Atoi(env.Getenv("LOCAL_WORLD_SIZE")); err == nil && n > 0 {
		return n
	}
	if env.Getenv("MESHRUN_NATS_URL") == "" {
		return world
	}
	return 1
}

// checkMemory refuses a workload whose estimate, per rank (parts describes
// it), times the ranks on this machine exceeds the memory available. Only
// host memory is checked (the cpu and sim devices); EnvMemoryCheck=0 skips
// the check, as does a machine that does not say what it has.
func checkMemory(env Env, dev tensor.DeviceKind, perRank int64, parts string, ranks int) error {
	if env.Getenv(EnvMemoryCheck) == "0" || dev == tensor.CUDA {
		return nil
	}
	avail, ok := memAvailable()
	if !ok {
		return nil
	}
	need, fits := int64(0), true
	if perRank > 0 && int64(ranks) > (1<<62)/perRank {
		fits = false
	} else {
		need = perRank * int64(ranks)
		fits = need <= avail
	}
	if fits {
		return nil
	}
	noun := "ranks"
	if ranks == 1 {
		noun = "rank"
	}
	if parts != "" {
		parts = " (" + parts + ")"
	}
	return fmt.Errorf("needs about %s per rank%s x %d %s on this machine; %s available (%s=0 skips this check)",
		layout.FormatBytes(perRank), parts, ranks, noun, layout.FormatBytes(avail), EnvMemoryCheck)
}
