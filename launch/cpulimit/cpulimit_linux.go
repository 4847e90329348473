// Package cpulimit caps processes at a share of the machine's cores:
// `launcher run --cpus-per-rank X` runs each rank in a cpu cgroup of its
// own whose CPU bandwidth is capped at X cores (a CFS quota over a period),
// pinned to the cores its share spans, so a rank runs at the same speed
// whether its neighbours compute or wait. The job's cgroup is made under
// the launcher's own (cgroup v2 with the cpu controller, else v1's cpu
// hierarchy), one child per rank; the rank moves itself in before it runs
// anything (what it starts follows), and the cgroups are removed when the
// job ends.
package cpulimit

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// --cpus-per-rank: each rank's processes in a cgroup of their own whose CPU
// bandwidth is capped at that many cores (CFS quota over period), so a rank
// runs at the same speed whether its neighbours compute or wait. The launcher
// makes the job's cgroup under its own (cgroup v2 with the cpu controller,
// else v1's cpu hierarchy), one child per rank, moves each rank's process in
// before it runs anything (and what it starts follows), and removes them when the job ends.

// cgroupRoot is where the cpu controller's hierarchy is mounted and the
// launcher's own cgroup in it.
type cgroupRoot struct {
	mount, own string
	v2         bool
}

// findCPUCgroup finds the cpu controller: a cgroup2 mount that offers it, or
// a v1 mount of the cpu hierarchy.
func findCPUCgroup() (cgroupRoot, error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return cgroupRoot{}, err
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return cgroupRoot{}, err
	}
	var v1, v2 string
	for _, line := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		switch g[0] {
		case "cgroup2":
			if v2 == "" {
				v2 = f[4]
			}
		case "cgroup":
			if slices.Contains(strings.Split(g[2], ","), "cpu") && v1 == "" {
				v1 = f[4]
			}
		}
	}
	var ownV1, ownV2 string
	for _, line := range strings.Split(string(own), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			ownV2 = parts[2]
		} else if slices.Contains(strings.Split(parts[1], ","), "cpu") {
			ownV1 = parts[2]
		}
	}
	if v2 != "" {
		if b, err := os.ReadFile(filepath.Join(v2, ownV2, "cgroup.controllers")); err == nil && slices.Contains(strings.Fields(string(b)), "cpu") {
			return cgroupRoot{mount: v2, own: ownV2, v2: true}, nil
		}
	}
	if v1 != "" {
		return cgroupRoot{mount: v1, own: ownV1}, nil
	}
	return cgroupRoot{}, errors.New("no cpu cgroup controller is mounted (cgroup v2 offering cpu, or v1's cpu hierarchy)")
}

// Problem says why --cpus-per-rank cpus cannot run here, "" when it can:
// the launcher must be allowed to make cgroups where its own is, unless
// cpus is a whole number of cores (pinning alone caps those: Pinned).
func Problem(cpus float64) string {
	if whole(cpus) {
		return ""
	}
	if _, err := usableCgroup(); err != nil {
		return fmt.Sprintf("--cpus-per-rank %v needs a cpu cgroup this launcher may create (usually as root; a whole number of cores needs none): %v", cpus, err)
	}
	return ""
}

// usableCgroup is the cpu controller's hierarchy, if the launcher may make
// cgroups under its own there.
func usableCgroup() (cgroupRoot, error) {
	r, err := findCgroup()
	if err == nil {
		err = syscall.Access(filepath.Join(r.mount, r.own), 2 /* W_OK */)
	}
	return r, err
}

// findCgroup is findCPUCgroup (a test's stand-in replaces it).
var findCgroup = findCPUCgroup

// whole reports a whole number of cores.
func whole(cpus float64) bool { return cpus >= 1 && cpus == math.Trunc(cpus) }

// Limit is a job's cgroup and the rank cgroups made in it, or, where each
// rank has a whole number of cores, the ranks' pinning alone (pinned).
type Limit struct {
	pinned        bool // no cgroups: the ranks are pinned only
	root          cgroupRoot
	x             float64
	allowed       []int // the launcher's CPUs
	dir           string
	quota, period int64 // microseconds
	ranks         map[int]string
}

// cfsPeriod is the period of a quota of cpus cores: short, so that a capped
// rank's throttling is spread finely (2 ms), but long enough for the
// kernel's least quota of 1 ms. The kernel charges the quota at its
// scheduler tick (4 ms at HZ=250), so a capped rank still runs in bursts of
// about a tick: its work of a few milliseconds takes from its own time to
// several periods more.
func cfsPeriod(cpus float64) int64 {
	return min(max(2000, int64(math.Ceil(1000/cpus))), 1000000)
}

// New makes job jobID's cgroup, for ranks of cpus cores each. A whole
// number of cores needs none: the ranks are pinned only, since a rank
// pinned to its cores cannot run on more, and a quota on top of the pin
// would only throttle it. The kernel charges a quota at its tick, so a
// rank capped at the one core it is pinned to was stopped for ticks at a
// time: its GEMMs of 0.7 ms took up to 2.9, its step 65 ms against 50
// pinned only (a GPT of width 256, GOMAXPROCS 1).
func New(jobID string, cpus float64) (*Limit, error) {
	var own cpuMask
	if err := threadAffinity(false, &own); err != nil {
		return nil, fmt.Errorf("--cpus-per-rank: the launcher's CPUs: %w", err)
	}
	if whole(cpus) {
		return &Limit{pinned: true, x: cpus, allowed: own.cores()}, nil
	}
	r, err := usableCgroup()
	if err != nil {
		return nil, err
	}
	period := cfsPeriod(cpus)
	c := &Limit{root: r, x: cpus, allowed: own.cores(), dir: filepath.Join(r.mount, r.own, "meshrun-"+jobID), period: period,
		quota: int64(math.Round(cpus * float64(period))), ranks: map[int]string{}}
	if err := os.Mkdir(c.dir, 0o755); err != nil && !os.IsExist(err) {
		return nil, fmt.Errorf("--cpus-per-rank: %w", err)
	}
	if r.v2 {
		// Each level hands the cpu controller down to its children.
		for _, d := range []string{filepath.Join(r.mount, r.own), c.dir} {
			if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+cpu"), 0); err != nil {
				c.Close()
				return nil, fmt.Errorf("--cpus-per-rank: enabling the cpu controller in %s: %w", d, err)
			}
		}
	}
	return c, nil
}

// Start starts local rank l's command on its CPUs (rankCores).
func (c *Limit) Start(cmd *exec.Cmd, l int) error {
	return startPinned(cmd, rankCores(c.allowed, l, c.x))
}

// Pinned reports ranks pinned without cgroups (a whole number of cores).
func (c *Limit) Pinned() bool { return c.pinned }

// Procs returns the cgroup.procs file of the rank's cgroup, made on first
// use: the rank's process writes its pid there before it runs anything;
// "" when the ranks are pinned only.
func (c *Limit) Procs(rank int) (string, error) {
	if c.pinned {
		return "", nil
	}
	d, ok := c.ranks[rank]
	if !ok {
		d = filepath.Join(c.dir, "rank-"+strconv.Itoa(rank))
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			return "", err
		}
		var err error
		if c.root.v2 {
			err = os.WriteFile(filepath.Join(d, "cpu.max"), fmt.Appendf(nil, "%d %d", c.quota, c.period), 0)
		} else {
			// The period first: a quota is checked against the period set.
			err = os.WriteFile(filepath.Join(d, "cpu.cfs_period_us"), fmt.Appendf(nil, "%d", c.period), 0)
			if err == nil {
				err = os.WriteFile(filepath.Join(d, "cpu.cfs_quota_us"), fmt.Appendf(nil, "%d", c.quota), 0)
			}
		}
		if err != nil {
			os.Remove(d)
			return "", err
		}
		c.ranks[rank] = d
	}
	return filepath.Join(d, "cgroup.procs"), nil
}

// Close removes the rank cgroups and the job's, waiting a little for
// processes that are still leaving them.
func (c *Limit) Close() error {
	if c.pinned {
		return nil
	}
	var err error
	dirs := append(slices.Collect(maps.Values(c.ranks)), c.dir)
	for _, d := range dirs {
		for try := 0; ; try++ {
			err = os.Remove(d)
			if err == nil || os.IsNotExist(err) || try == 50 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return err
}

// cpuMask is a CPU affinity mask (the kernel's cpu_set_t, 1024 CPUs).
type cpuMask [16]uint64

// threadAffinity reads or sets the calling thread's CPU affinity.
func threadAffinity(set bool, m *cpuMask) error {
	nr := uintptr(syscall.SYS_SCHED_GETAFFINITY)
	if set {
		nr = syscall.SYS_SCHED_SETAFFINITY
	}
	if _, _, e := syscall.RawSyscall(nr, 0, unsafe.Sizeof(*m), uintptr(unsafe.Pointer(m))); e != 0 {
		return e
	}
	return nil
}

// JobDir is where job jobID's cgroup is (or would be) made, "" where no
// cpu controller is mounted.
func JobDir(jobID string) string {
	r, err := findCPUCgroup()
	if err != nil {
		return ""
	}
	return filepath.Join(r.mount, r.own, "meshrun-"+jobID)
}

// ThreadCPUs lists the CPUs the calling thread may run on.
func ThreadCPUs() ([]int, error) {
	var m cpuMask
	if err := threadAffinity(false, &m); err != nil {
		return nil, err
	}
	return m.cores(), nil
}

// cores lists the CPUs in m.
func (m *cpuMask) cores() []int {
	var out []int
	for i := range 64 * len(m) {
		if m[i/64]&(1<<(i%64)) != 0 {
			out = append(out, i)
		}
	}
	return out
}

// rankCores packs local rank l of x cores each onto the launcher's CPUs
// (allowed, in order): rank l takes CPUs ⌊l·x⌋ to ⌈(l+1)·x⌉−1, wrapping
// around when the ranks ask for more than there are; at x = 0.5 ranks 0
// and 1 share the first CPU, 2 and 3 the second.
func rankCores(allowed []int, l int, x float64) cpuMask {
	var m cpuMask
	lo, hi := int(math.Floor(float64(l)*x+1e-9)), int(math.Ceil(float64(l+1)*x-1e-9))
	for i := lo; i < max(hi, lo+1); i++ {
		c := allowed[i%len(allowed)]
		m[c/64] |= 1 << (c % 64)
	}
	return m
}

// startPinned starts cmd on the CPUs of mask: the thread that forks it
// takes them for the fork (the child inherits them, with every thread it
// makes), then gets its own back.
func startPinned(cmd *exec.Cmd, mask cpuMask) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old cpuMask
	if err := threadAffinity(false, &old); err != nil {
		return err
	}
	if err := threadAffinity(true, &mask); err != nil {
		return fmt.Errorf("pinning to CPUs %v: %w", mask.cores(), err)
	}
	err := cmd.Start()
	if e := threadAffinity(true, &old); e != nil && err == nil {
		err = e
	}
	return err
}
