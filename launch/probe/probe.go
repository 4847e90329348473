// Package probe is what the launcher learns of a rank from the outside:
// its stacks on SIGUSR1 (Python ranks through the site hook the launcher
// puts on their PYTHONPATH, meshrun's workers through runlog), what /proc
// says (state, kernel wait channel, system call, CPU time), and a Python
// rank's uncaught exception; and `launcher stacks`, which asks a running
// job's ranks for their stacks. docs/launcher.md ("A PyTorch job
// explained") describes it.
package probe

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/logview"
	"github.com/meshrun/meshrun/runlog"
)

// ProcessState reads a process's state from /proc: "T (stopped)", "S
// (sleeping)", ...; "" when unknown.
func ProcessState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	c := s[i+2]
	names := map[byte]string{'R': "running", 'S': "sleeping", 'D': "disk sleep", 'T': "stopped", 't': "tracing stop", 'Z': "zombie", 'X': "dead"}
	if n, ok := names[c]; ok {
		return string(c) + " (" + n + ")"
	}
	return string(c)
}

// clkTck is the kernel's clock ticks per second (/proc's unit of CPU time).
const clkTck = 100

// GroupStats is, for each process of process group pgid, the fields of
// its /proc/PID/stat after the command: [0] is the state (field 3 of
// proc(5)), [2] the process group (5), [11] and [12] the user and system
// CPU time in clock ticks (14, 15).
func GroupStats(pgid int) [][]string {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out [][]string
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(s[i+1:]); len(f) >= 13 && f[2] == strconv.Itoa(pgid) {
			out = append(out, f)
		}
	}
	return out
}

// GroupCPU is the CPU seconds (user and system) of the processes in process
// group pgid, from /proc.
func GroupCPU(pgid int) float64 {
	var ticks int64
	for _, f := range GroupStats(pgid) {
		u, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + st
	}
	return float64(ticks) / clkTck
}

// ProcInfo is what /proc says of a process that dumps no stacks: its state,
// the kernel function it waits in and its system call.
func ProcInfo(pid int) string {
	st := ProcessState(pid)
	if st == "" {
		return "no longer running"
	}
	parts := []string{st}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid)); err == nil && len(b) > 0 && string(b) != "0" {
		parts = append(parts, "wchan "+string(b))
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", pid)); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 && f[0] != "running" {
			parts = append(parts, "syscall "+f[0])
		}
	}
	return strings.Join(parts, ", ")
}

// StacksWait bounds how long the launcher waits for the ranks' dumps.
const StacksWait = 2 * time.Second

// Target is a rank to ask for its stacks.
type Target struct {
	Rank, PID int
	Dir       string // its folder
	Runtime   string // "python", "go" or "" (no dumps)
}

// Collect dumps the stacks of targets (see attempt.Collect).
func Collect(targets []Target, wait time.Duration) []logview.RankStacks {
	type pending struct {
		t      Target
		before int64    // the Python dump file's size before the signal
		seen   []string // the Go dumps before the signal
	}
	ps := make([]pending, len(targets))
	for i, t := range targets {
		ps[i].t = t
		switch t.Runtime {
		case "python":
			if fi, err := os.Stat(filepath.Join(t.Dir, PythonStacksFile)); err == nil {
				ps[i].before = fi.Size()
			}
		case "go":
			ps[i].seen = GoDumps(t.Dir)
		}
		if t.Runtime != "" {
			syscall.Kill(t.PID, syscall.SIGUSR1)
		}
	}
	out := make([]logview.RankStacks, len(targets))
	deadline := time.Now().Add(wait)
	done := make([]bool, len(targets))
	var lastSize = make([]int64, len(targets))
	for {
		left := 0
		for i, p := range ps {
			if done[i] {
				continue
			}
			t := p.t
			switch t.Runtime {
			case "python":
				path := filepath.Join(t.Dir, PythonStacksFile)
				fi, err := os.Stat(path)
				// Done when it grew and held its size over one poll.
				if err == nil && fi.Size() > p.before && fi.Size() == lastSize[i] {
					if b, err := readFrom(path, p.before); err == nil {
						out[i] = logview.RankStacks{Rank: t.Rank, Kind: "python", Threads: logview.ParsePythonDump(string(b)), File: path}
						done[i] = true
						continue
					}
				}
				if err == nil {
					lastSize[i] = fi.Size()
				}
			case "go":
				if f := newDump(t.Dir, p.seen); f != "" {
					if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), "goroutine ") {
						out[i] = logview.RankStacks{Rank: t.Rank, Kind: "go", Threads: logview.ParseGoDump(string(b)), File: f}
						done[i] = true
						continue
					}
				}
			default:
				out[i] = logview.RankStacks{Rank: t.Rank, Kind: "proc", Proc: ProcInfo(t.PID)}
				done[i] = true
				continue
			}
			left++
		}
		if left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i, p := range ps {
		if !done[i] {
			out[i] = logview.RankStacks{Rank: p.t.Rank, Kind: "proc", Proc: ProcInfo(p.t.PID) + fmt.Sprintf(" (wrote no stacks within %v of SIGUSR1)", wait)}
		}
	}
	return out
}

// PythonException is the uncaught exception a Python rank died of: the
// site hook's record (exception.json in its folder), else the last
// traceback at the end of its stderr.log; nil when neither says.
func PythonException(dir string) *logview.PyException {
	if dir == "" {
		return nil
	}
	if e := logview.ReadPythonException(filepath.Join(dir, PythonExceptionFile)); e != nil {
		return e
	}
	b, err := readTail(filepath.Join(dir, "stderr.log"), 64<<10)
	if err != nil {
		return nil
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	for i, l := range lines {
		// Each line of the file starts with the time it was read.
		if _, rest, ok := strings.Cut(l, " "); ok {
			lines[i] = rest
		}
	}
	return logview.ParsePythonTraceback(lines)
}

// readTail is the last n bytes of a file, from a line's start.
func readTail(path string, n int64) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	off := max(fi.Size()-n, 0)
	b, err := readFrom(path, off)
	if err == nil && off > 0 {
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return b, err
}

// readFrom is a file's bytes from offset off on.
func readFrom(path string, off int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return nil, err
	}
	return io.ReadAll(f)
}

// GoDumps lists a Go rank's dumps (runlog's stacks-<ms>.txt).
func GoDumps(dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, runlog.StacksPrefix+"[0-9]*.txt"))
	sort.Strings(m)
	return m
}

// newDump is a dump in dir that is not in seen, "" when none.
func newDump(dir string, seen []string) string {
	for _, f := range GoDumps(dir) {
		if !slices.Contains(seen, f) {
			return f
		}
	}
	return ""
}

// Format is the text of a stacks file and of `launcher stacks`: the
// groups (the odd one out first), then each rank's dump file.
func Format(stacks []logview.RankStacks, groups []logview.Group, odd int) string {
	var b strings.Builder
	order := make([]int, 0, len(groups))
	if odd >= 0 {
		order = append(order, odd)
	}
	for i := range groups {
		if i != odd {
			order = append(order, i)
		}
	}
	for _, i := range order {
		g := groups[i]
		head := g.Describe()
		if i == odd {
			head += "   <- the odd one out"
		}
		fmt.Fprintf(&b, "== %s\n%s\n", head, g.Text())
	}
	for _, s := range stacks {
		if s.File != "" {
			fmt.Fprintf(&b, "rank %d: %s (%s)\n", s.Rank, s.File, s.Kind)
		}
	}
	return b.String()
}

// NewestGoDumpSince is a Go rank's newest dump written at or after t.
func NewestGoDumpSince(dir string, t time.Time) string {
	best := ""
	for _, f := range GoDumps(dir) {
		ms, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), runlog.StacksPrefix), ".txt"), 10, 64)
		if err == nil && ms >= t.UnixMilli()-1 {
			best = f
		}
	}
	return best
}

// ExceptionTime is when the site hook recorded a rank's uncaught exception
// (unix ms; 0 when it recorded none).
func ExceptionTime(dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, PythonExceptionFile))
	if err != nil {
		return 0
	}
	var r struct {
		TimeMS int64 `json:"time_ms"`
	}
	if json.Unmarshal(b, &r) != nil {
		return 0
	}
	return r.TimeMS
}
