package launch

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshrun/meshrun/internal/testtime"
)

// chaosFault is a fault the chaos soak does to one rank of a running job,
// and the root cause the launcher must name for it.
type chaosFault struct {
	name   string
	sig    syscall.Signal // sent to the rank from outside; SIGUSR2: ranktest -fault does it
	fault  string         // ranktest -fault, for SIGUSR2
	code   int            // the launcher's exit code
	hung   bool
	crash  string // root_cause.crash
	signal string // root_cause.signal
}

var chaosFaults = []chaosFault{
	{name: "SIGKILL", sig: syscall.SIGKILL, code: 137, signal: "SIGKILL"},
	{name: "SIGTERM", sig: syscall.SIGTERM, code: 143},
	{name: "SIGSTOP", sig: syscall.SIGSTOP, code: ExitHang, hung: true},
	{name: "SIGSEGV", sig: syscall.SIGSEGV, code: 139, crash: "SIGSEGV", signal: "SIGSEGV"},
	{name: "panic", sig: syscall.SIGUSR2, fault: "panic", code: ExitCrash, crash: "panic"},
	{name: "exit 3", sig: syscall.SIGUSR2, fault: "exit", code: 3},
	{name: "hang", sig: syscall.SIGUSR2, fault: "hang", code: ExitHang, hung: true},
}

var chaosTransports = []string{"shm", "tcp", "nats"}

// chaosResult is one job of the soak.
type chaosResult struct {
	fault     chaosFault
	rank, n   int
	transport string
	right     bool
	named     string        // the root cause the launcher named
	detect    time.Duration // from the fault to the launcher's exit
	procs     int           // the job's processes left
	shm       int           // /dev/shm files of the job left
	fds       int           // the launcher's descriptors beyond the baseline
}

// TestChaos: jobs of 2 to 4 ranks (ranktest's barrier loop) over a transport
// (shm, tcp, nats), each with one fault done to one rank once it runs:
// SIGKILL, SIGTERM, SIGSTOP, SIGSEGV from outside, a panic, exit 3, a hang
// (alive, never entering the next barrier). For each, the launcher must name
// that rank as the root cause with the fault's exit code (137, 143, 125
// hung, 139 a SIGSEGV crash, 126 a panic, 3, 125 hung), and nothing may be
// left: no process of the job, no /dev/shm file, no descriptor of the
// launcher. MESHRUN_CHAOS=N runs N jobs with faults, ranks and transports
// drawn at random (MESHRUN_CHAOS_SEED, default the time: printed);
// bench/soak/chaos.sh runs 100. Without it, the suite runs each fault once,
// over the transports in turn.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 7 jobs")
	}
	n, random := len(chaosFaults), false
	if v, err := strconv.Atoi(os.Getenv("MESHRUN_CHAOS")); err == nil && v > 0 {
		n, random = v, true
	}
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("MESHRUN_CHAOS_SEED"), 10, 64); err == nil {
		seed = v
	}
	if !random {
		seed = 1
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("chaos: %d jobs, seed %d", n, seed)
	logDir := t.TempDir()

	var base soakCount
	var results []chaosResult
	for i := 0; i < n; i++ {
		f, tr := chaosFaults[i%len(chaosFaults)], chaosTransports[i%len(chaosTransports)]
		if random {
			f, tr = chaosFaults[rng.IntN(len(chaosFaults))], chaosTransports[rng.IntN(len(chaosTransports))]
		}
		ranks := 2 + rng.IntN(3)
		r := chaosJob(t, logDir, fmt.Sprintf("chaos-%d-%d", seed, i), f, tr, ranks, rng.IntN(ranks), &base, i == 0)
		results = append(results, r)
		verdict := "right"
		if !r.right {
			verdict = "WRONG"
		}
		t.Logf("chaos %3d/%d: %-7s rank %d of %d over %-4s: launcher named %s: %s; detected in %4d ms; left: %d processes, %d shm files, %d fds",
			i+1, n, f.name, r.rank, r.n, tr, r.named, verdict, r.detect.Milliseconds(), r.procs, r.shm, r.fds)
		if t.Failed() && !random {
			break
		}
	}

	right, procs, shm, fds := 0, 0, 0, 0
	var times []time.Duration
	for _, r := range results {
		if r.right {
			right++
		}
		procs, shm, fds = procs+r.procs, shm+r.shm, fds+r.fds
		times = append(times, r.detect)
	}
	slices.Sort(times)
	t.Logf("chaos: %d jobs, seed %d: %d right root causes (%.0f%%); detection median %d ms, worst %d ms; left: %d processes, %d shm files, %d fds",
		len(results), seed, right, 100*float64(right)/float64(len(results)), times[len(times)/2].Milliseconds(), times[len(times)-1].Milliseconds(), procs, shm, fds)
	for _, f := range chaosFaults {
		var ts []time.Duration
		for _, r := range results {
			if r.fault.name == f.name {
				ts = append(ts, r.detect)
			}
		}
		if len(ts) > 0 {
			slices.Sort(ts)
			t.Logf("chaos: %-7s %3d jobs, detection median %5d ms, worst %5d ms", f.name, len(ts), ts[len(ts)/2].Milliseconds(), ts[len(ts)-1].Milliseconds())
		}
	}
	if right != len(results) || procs+shm+fds > 0 {
		t.Errorf("%d of %d root causes wrong; left %d processes, %d shm files, %d fds", len(results)-right, len(results), procs, shm, fds)
	}
}

// chaosJob runs one job of the soak: f done to rank of ranks ranks over
// transport tr, once the job runs.
func chaosJob(t *testing.T, logDir, id string, f chaosFault, tr string, ranks, rank int, base *soakCount, first bool) chaosResult {
	t.Helper()
	res := chaosResult{fault: f, rank: rank, n: ranks, transport: tr}
	t.Setenv("MESHRUN_TRANSPORT", tr)
	shmBefore, _ := filepath.Glob("/dev/shm/meshrun-*")
	args := []string{"run", "--worker", worker(), "--log-dir", logDir, "--job-id", id, "--grace", "2s", "--hang-after", "2s",
		"-n", strconv.Itoa(ranks), "--", ranktest(), "-steps", "0", "-fail-code", "3"}
	if f.fault != "" {
		args = append(args, "-fault", f.fault)
	}
	var out, errb syncBuffer
	done := make(chan int, 1)
	var end time.Time
	go func() {
		code := Main(context.Background(), args, &out, &errb)
		end = time.Now()
		done <- code
	}()
	dir := filepath.Join(logDir, id)
	rec := waitJobRecord(t, dir)
	waitFor(t, 30*time.Second, "the ranks' barriers", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, RankDir(rank), "stdout.log"))
		return bytes.Count(b, []byte("@meshrun:progress")) >= 3
	})
	pid := rec.Ranks[rank].PID
	faulted := time.Now()
	syscall.Kill(pid, f.sig)
	var code int
	select {
	case code = <-done:
	case <-time.After(testtime.Scale(60 * time.Second)):
		t.Fatalf("%s: the launcher did not end within 60 s of %s to rank %d:\n%s", id, f.name, rank, errb.String())
	}
	res.detect = end.Sub(faulted)

	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	rc := sum.RootCause
	if rc == nil {
		res.named = fmt.Sprintf("none (%s, exit %d)", sum.Reason, code)
	} else {
		res.named = fmt.Sprintf("rank %d %s", rc.Rank, rc.How())
		res.right = rc.Rank == rank && code == f.code && exitCodeOf(rc) == f.code && rc.Hung == f.hung &&
			rc.Crash == f.crash && (f.signal == "" || rc.Signal == f.signal) && !slices.Contains(sum.Victims, rank)
	}
	if !res.right {
		t.Errorf("%s: %s to rank %d over %s: exit %d, root cause %+v\n%s", id, f.name, rank, tr, code, rc, errb.String())
	}

	// What is left, once the job's processes had a moment to go: its
	// processes (by their job id), its shared-memory rings, the launcher's
	// descriptors beyond what it held after the first job (the runtime's
	// own threads and pools are not growth).
	settle := time.Now().Add(testtime.Scale(3 * time.Second))
	for {
		res.procs = jobProcesses(id)
		for _, r := range rec.Ranks {
			if groupLive(r.PID) {
				res.procs++
			}
		}
		shmAfter, _ := filepath.Glob("/dev/shm/meshrun-*")
		res.shm = 0
		for _, s := range shmAfter {
			if !slices.Contains(shmBefore, s) {
				res.shm++
			}
		}
		c := soakCounts()
		if first {
			*base = c
		}
		res.fds = max(0, c.fds-base.fds)
		if res.procs+res.shm+res.fds == 0 || time.Now().After(settle) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if res.procs+res.shm+res.fds > 0 {
		t.Errorf("%s: left %d processes, %d shm files, %d descriptors (goroutines %d, %d after the first job)", id, res.procs, res.shm, res.fds,
			runtime.NumGoroutine(), base.goroutines)
	}
	return res
}

// jobProcesses counts the live processes whose environment names job id.
func jobProcesses(id string) int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if slices.Contains(strings.Split(string(b), "\x00"), "MESHRUN_JOB_ID="+id) && processAlive(pid) {
			n++
		}
	}
	return n
}
