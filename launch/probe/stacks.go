package probe

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/meshrun/meshrun/internal/exitcode"
	"github.com/meshrun/meshrun/internal/flaghelp"
	"github.com/meshrun/meshrun/logview"
	"github.com/meshrun/meshrun/runlog"
)

const stacksUsage = `usage: launcher stacks [JOB|latest] [--log-dir DIR] [--wait DUR]
  every running rank's stacks, grouped by stack (the odd one out first), from a
  job this machine runs: Python ranks through the launcher's site hook, meshrun's
  workers through runlog (both on SIGUSR1, which they survive), any other
  program from /proc (state, kernel wait channel, system call). The job goes on;
  the text is also written to the job's folder as stacks-<ms>.txt.
`

// StacksMain is `launcher stacks`.
func StacksMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("stacks", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	logDir := fs.String("log-dir", "runs", "the jobs' `DIR`")
	wait := fs.Duration("wait", StacksWait, "how long to wait for the ranks' dumps")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, stacksUsage+"\nflags:\n")
			flaghelp.Flags(stdout, fs)
			return 0
		}
		fmt.Fprintf(stderr, "launcher stacks: %v (launcher stacks -h lists the flags)\n", flaghelp.Error(fs, err))
		return exitcode.Usage
	}
	job := ""
	if fs.NArg() > 1 {
		fmt.Fprintf(stderr, "launcher stacks: one job at most, got %q\n", fs.Args())
		return exitcode.Usage
	}
	if fs.NArg() == 1 {
		job = fs.Arg(0)
	}
	if *wait <= 0 {
		fmt.Fprintf(stderr, "launcher stacks: --wait %v: must be positive\n", *wait)
		return exitcode.Usage
	}
	dir, err := logview.ResolveJob(*logDir, job)
	if err != nil {
		fmt.Fprintf(stderr, "launcher stacks: %v\n", err)
		return exitcode.Usage
	}
	targets, attemptDir, err := liveRanks(dir)
	if err != nil {
		fmt.Fprintf(stderr, "launcher stacks: %v\n", err)
		return 1
	}
	if len(targets) == 0 {
		fmt.Fprintf(stderr, "launcher stacks: no rank of %s is running on this machine\n", filepath.Base(dir))
		return 1
	}
	now := time.Now()
	stacks := Collect(targets, *wait)
	groups, odd := logview.GroupStacks(stacks)
	text := Format(stacks, groups, odd)
	path := filepath.Join(attemptDir, fmt.Sprintf("stacks-%d.txt", now.UnixMilli()))
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		fmt.Fprintf(stderr, "launcher stacks: %v\n", err)
	} else {
		text += "written to " + path + "\n"
	}
	fmt.Fprint(stdout, text)
	return 0
}

// liveRanks reads the job's events: the ranks of its last attempt on this
// machine that have not exited, each checked to be the rank it was (its
// MESHRUN_RANK_DIR, so that a reused pid is never signalled), with what its
// hello marker said it dumps.
func liveRanks(dir string) ([]Target, string, error) {
	f, err := os.Open(filepath.Join(dir, logview.EventsFile))
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	type ev struct {
		Event   string `json:"event"`
		Attempt int    `json:"attempt"`
		Dir     string `json:"dir"`
		Rank    int    `json:"rank"`
		PID     int    `json:"pid"`
	}
	pids := map[int]int{}
	attempt, attemptDir, ended := -1, dir, false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e ev
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		switch e.Event {
		case "attempt_start":
			attempt, pids = e.Attempt, map[int]int{}
			if e.Attempt > 0 {
				attemptDir = filepath.Join(dir, logview.AttemptDir(e.Attempt))
			}
		case "rank_start":
			if e.Attempt == attempt {
				pids[e.Rank] = e.PID
			}
		case "rank_exit":
			if e.Attempt == attempt {
				delete(pids, e.Rank)
			}
		case "job_end":
			ended = true
		}
	}
	if ended {
		return nil, attemptDir, fmt.Errorf("job %s has ended (launcher logs why %s says how)", filepath.Base(dir), filepath.Base(dir))
	}
	ranks := make([]int, 0, len(pids))
	for r := range pids {
		ranks = append(ranks, r)
	}
	sort.Ints(ranks)
	var out []Target
	for _, r := range ranks {
		rd, err := filepath.Abs(filepath.Join(attemptDir, logview.RankDir(r)))
		if err != nil || !IsRankProcess(pids[r], rd) {
			continue
		}
		t := Target{Rank: r, PID: pids[r], Dir: rd}
		if h := helloOf(filepath.Join(rd, "stdout.log")); h.Runtime != "" && (h.PID <= 0 || IsRankProcess(h.PID, rd)) {
			t.Runtime = h.Runtime
			if h.PID > 0 {
				t.PID = h.PID
			}
		}
		out = append(out, t)
	}
	return out, attemptDir, nil
}

// IsRankProcess reports whether pid is still a process of the rank whose
// folder is dir (it has the rank's MESHRUN_RANK_DIR).
func IsRankProcess(pid int, dir string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return false
	}
	want := runlog.EnvRankDir + "=" + dir
	for _, kv := range strings.Split(string(b), "\x00") {
		if kv == want {
			return true
		}
	}
	return false
}

// helloOf is what a rank's hello marker (in its stdout.log) says.
func helloOf(stdoutLog string) Hello {
	f, err := os.Open(stdoutLog)
	if err != nil {
		return Hello{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for n := 0; sc.Scan() && n < 1000; n++ {
		_, l, ok := strings.Cut(sc.Text(), " "+runlog.Marker+"hello ")
		if !ok {
			continue
		}
		return ReadHello([]byte(l))
	}
	return Hello{}
}

// Hello is what a rank's hello marker says: the runtime that dumps its
// stacks on SIGUSR1 ("python", "go"; "" when none does) and the process
// that does (0: the rank's own; a Python started by a shell script that is
// the rank names itself, and the launcher signals it, not the shell).
type Hello struct {
	Runtime string
	PID     int
}

// ReadHello reads a hello marker's body.
func ReadHello(body []byte) Hello {
	var h struct {
		Stacks  bool   `json:"stacks_on_sigusr1"`
		Runtime string `json:"runtime"`
		PID     int    `json:"pid"`
	}
	if json.Unmarshal(body, &h) != nil || !h.Stacks {
		return Hello{}
	}
	if h.Runtime == "python" {
		return Hello{Runtime: "python", PID: h.PID}
	}
	return Hello{Runtime: "go", PID: h.PID}
}
