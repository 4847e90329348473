package launch

import (
	"bytes"
	"context"

	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/meshrun/meshrun/internal/testtime"
)

// failFastBound: how soon a launcher must end once its job cannot run, far
// below the ranks' 30 s rendezvous deadline (scaled: testtime).
var failFastBound = testtime.Scale(2 * time.Second)

// bgLauncher is a launcher running in the background of a test.
type bgLauncher struct {
	dir      string // its --log-dir
	cancel   context.CancelFunc
	done     chan struct{}
	code     int
	end      time.Time
	out, err syncBuffer
}

// syncBuffer is a bytes.Buffer safe for the launcher's console goroutines and
// the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startLauncher runs `launcher run args` in the background.
func startLauncher(t *testing.T, args ...string) *bgLauncher {
	t.Helper()
	l := &bgLauncher{dir: t.TempDir(), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	go func() {
		defer close(l.done)
		l.code = Main(ctx, append([]string{"run", "--log-dir", l.dir, "--grace", "1s", "--worker", worker()}, args...), &l.out, &l.err)
		l.end = time.Now()
	}()
	t.Cleanup(func() { cancel(); <-l.done })
	return l
}

// waitEvent waits until the launcher's events.jsonl of job has an event
// named kind.
func (l *bgLauncher) waitEvent(t *testing.T, job, kind string) {
	t.Helper()
	waitFor(t, 20*time.Second, kind+" in "+job+"'s events", func() bool {
		b, _ := os.ReadFile(filepath.Join(l.dir, job, EventsFile))
		return bytes.Contains(b, []byte(`"event":"`+kind+`"`))
	})
}

// wait waits for the launcher's exit, at most d (scaled: testtime).
func (l *bgLauncher) wait(t *testing.T, d time.Duration) {
	t.Helper()
	d = testtime.Scale(d)
	select {
	case <-l.done:
	case <-time.After(d):
		t.Fatalf("the launcher did not exit within %v:\n%s%s", d, l.out.String(), l.err.String())
	}
}

// TestJobIDTaken: a second launcher for a node of a running job (the same
// --job-id on the same NATS), or one whose --nnodes differ from the running
// node's, is refused within the bound with exit 2, naming the launcher that
// runs it; the running job goes on, and says it refused one.
func TestJobIDTaken(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs nats-server")
	}
	jobs := map[string]creds.Credentials{"taken-job": {User: "job-taken", Password: "pw-taken"}}
	url := standaloneNATS(t, jobs)
	credsFile := writeCreds(t, jobs["taken-job"])
	common := []string{"--nats", url, "--nats-creds", credsFile, "--job-id", "taken-job"}
	first := startLauncher(t, append(common, "-n", "1", "--", "sleep", "60")...)
	first.waitEvent(t, "taken-job", "rank_start")
	for _, tc := range []struct {
		name  string
		flags []string
		want  string
	}{
		{"same node", []string{"-n", "1"}, "node 0 of job taken-job already runs: the launcher of node 0 on "},
		{"other shape", []string{"-n", "1", "--nnodes", "2", "--node-rank", "1"}, "the launcher of node 0 on "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			second := startLauncher(t, append(append(common, tc.flags...), "--", "sleep", "60")...)
			second.wait(t, 10*time.Second)
			took := second.end.Sub(start)
			t.Logf("refused after %v: %s", took.Round(time.Millisecond), strings.TrimSpace(second.err.String()))
			if second.code != ExitUsage {
				t.Errorf("exit %d, want %d", second.code, ExitUsage)
			}
			if !strings.Contains(second.err.String(), tc.want) || !strings.Contains(second.err.String(), fmt.Sprintf("pid %d", os.Getpid())) {
				t.Errorf("stderr %q lacks %q and the pid", second.err.String(), tc.want)
			}
			if took > failFastBound {
				t.Errorf("refused after %v, want < %v", took, failFastBound)
			}
			if b, _ := os.ReadFile(filepath.Join(second.dir, "taken-job", EventsFile)); bytes.Contains(b, []byte(`"rank_start"`)) {
				t.Error("the refused launcher started a rank")
			}
		})
	}
	select {
	case <-first.done:
		t.Fatalf("the running job ended (exit %d):\n%s", first.code, first.err.String())
	default:
	}
	waitFor(t, 5*time.Second, "the running launcher's word", func() bool {
		return strings.Count(first.err.String(), "refused a second launcher") == 2
	})
	first.cancel()
	first.wait(t, 10*time.Second)
	if first.code != ExitInterrupted {
		t.Errorf("the first launcher, interrupted: exit %d", first.code)
	}
}

// TestNodeCannotStart: the launcher of one node fails before starting its
// ranks (a workload flag the worker refuses; -n gpu in a build without
// CUDA): it says so on NATS, and the other node's launcher ends within the
// bound with exit 1 naming that node and its reason, instead of its ranks
// waiting out the rendezvous. Whichever node fails: node 1 while node 0's
// ranks wait in their rendezvous, or node 0 while node 1 waits for its
// MASTER_ADDR.
func TestNodeCannotStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs nats-server")
	}
	jobs := map[string]creds.Credentials{"ns-1": {User: "job-ns-1", Password: "pw-ns-1"}, "ns-0": {User: "job-ns-0", Password: "pw-ns-0"}}
	url := standaloneNATS(t, jobs)
	for _, tc := range []struct {
		job        string
		bad        int // the node that cannot start
		badFlags   []string
		badWork    []string
		wantReason string
		waitFor    string // the event of the good node before the bad one starts
	}{
		{"ns-1", 1, nil, []string{"barrier", "--bogus"}, "unknown flag --bogus", "rank_start"},
		{"ns-0", 0, []string{"-n", "gpu"}, []string{"barrier"}, "built without CUDA support", "nats_ready"},
	} {
		t.Run(fmt.Sprintf("node %d", tc.bad), func(t *testing.T) {
			good := 1 - tc.bad
			common := []string{"--nats", url, "--nats-creds", writeCreds(t, jobs[tc.job]), "--job-id", tc.job, "--nnodes", "2", "-n", "1"}
			ok := startLauncher(t, append(common, append([]string{"--node-rank", fmt.Sprint(good)}, "barrier")...)...)
			ok.waitEvent(t, tc.job, tc.waitFor)
			args := append(append(append(common, "--node-rank", fmt.Sprint(tc.bad)), tc.badFlags...), tc.badWork...)
			bad := startLauncher(t, args...)
			bad.wait(t, 10*time.Second)
			if bad.code != ExitUsage || !strings.Contains(bad.err.String(), tc.wantReason) {
				t.Fatalf("the failing node: exit %d, stderr %q", bad.code, bad.err.String())
			}
			ok.wait(t, 10*time.Second)
			took := ok.end.Sub(bad.end)
			t.Logf("node %d ended %v after node %d:\n%s", good, took.Round(time.Millisecond), tc.bad, ok.err.String())
			if ok.code != 1 {
				t.Errorf("node %d: exit %d, want 1", good, ok.code)
			}
			want := fmt.Sprintf("node %d cannot start: ", tc.bad)
			if !strings.Contains(ok.err.String(), want) || !strings.Contains(ok.err.String(), tc.wantReason) {
				t.Errorf("node %d's console lacks %q and %q:\n%s", good, want, tc.wantReason, ok.err.String())
			}
			if took > failFastBound {
				t.Errorf("node %d ended %v after node %d, want < %v", good, took, tc.bad, failFastBound)
			}
			sum := readJSON[Summary](t, filepath.Join(ok.dir, tc.job, SummaryFile))
			if sum.Reason != OutcomeFatal || !strings.Contains(sum.Error, want) {
				t.Errorf("node %d's summary: reason %s, error %q", good, sum.Reason, sum.Error)
			}
		})
	}
}

// TestWrongJobCredentials: launchers given credentials of another job (their
// --job-id is not the credentials' job), or credentials the server refuses,
// end within the bound naming the subject the server refused and the job id,
// or the credentials file and the server's answer; not at the rendezvous
// deadline.
func TestWrongJobCredentials(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs nats-server")
	}
	jobs := map[string]creds.Credentials{"perm-a": {User: "job-perm-a", Password: "pw-perm-a"}}
	url := standaloneNATS(t, jobs)
	for _, tc := range []struct {
		name, job string
		creds     creds.Credentials
		want      []string
	}{
		{"another job's", "perm-x", jobs["perm-a"], []string{`is not allowed for credentials file`, `"meshrun.perm-x.`, `--job-id is "perm-x"`}},
		{"a wrong password", "perm-a", creds.Credentials{User: "job-perm-a", Password: "guess"}, []string{"NATS refused the credentials", `(user "job-perm-a"): nats: Authorization Violation`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			codes, _, consoles := runNodes(t, url, writeCreds(t, tc.creds), tc.job, 2, 1, "barrier")
			took := time.Since(start)
			for node, code := range codes {
				t.Logf("node %d: exit %d after %v: %s", node, code, took.Round(time.Millisecond), strings.TrimSpace(consoles[node]))
				if code == 0 {
					t.Errorf("node %d: exit 0", node)
				}
				for _, want := range tc.want {
					if !strings.Contains(consoles[node], want) {
						t.Errorf("node %d: console lacks %q", node, want)
					}
				}
				if strings.Contains(consoles[node], tc.creds.Password) {
					t.Errorf("node %d: the console shows the password", node)
				}
			}
			if took > failFastBound {
				t.Errorf("the launchers ended after %v, want < %v", took, failFastBound)
			}
		})
	}
}

// TestSharedLogDir: two nodes of a job given one --log-dir (a shared file
// system): the second is refused at once, told to give each node its own,
// and the first goes on; the job folder's events file is created
// exclusively, so two launchers starting together cannot both take it.
func TestSharedLogDir(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs nats-server")
	}
	jobs := map[string]creds.Credentials{"shared": {User: "job-shared", Password: "pw-shared"}}
	url := standaloneNATS(t, jobs)
	common := []string{"--nats", url, "--nats-creds", writeCreds(t, jobs["shared"]), "--job-id", "shared", "--nnodes", "2", "-n", "1"}
	first := startLauncher(t, append(common, "--node-rank", "0", "--", "sleep", "30")...)
	first.waitEvent(t, "shared", "rank_start")
	var out, errb bytes.Buffer
	code := Main(context.Background(), append([]string{"run", "--log-dir", first.dir, "--worker", worker()}, append(common, "--node-rank", "1", "--", "sleep", "30")...), &out, &errb)
	if code != ExitUsage || !strings.Contains(errb.String(), "holds node 0's logs of job shared: with several nodes on one file system give each node its own --log-dir") {
		t.Errorf("exit %d: %s", code, errb.String())
	}
	select {
	case <-first.done:
		t.Errorf("the first node ended: %s", first.err.String())
	default:
	}
}
