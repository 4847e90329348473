package launch

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap/natsconn"
	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/meshrun/meshrun/internal/testpki"
	"github.com/meshrun/meshrun/internal/testtime"
	"github.com/meshrun/meshrun/protocol"
	"github.com/nats-io/nats.go"
)

var (
	natsServerOnce sync.Once
	natsServerBin  string
	natsServerErr  error
)

// standaloneNATS starts the nats-server program (built from the module) as its
// own process on loopback, with one user per job allowed only its job's subjects.
func standaloneNATS(t *testing.T, jobs map[string]creds.Credentials) string {
	return standaloneNATSWith(t, jobs, "")
}

// standaloneNATSWith is standaloneNATS with extra server configuration (a tls
// block); the URL it returns is tls:// when the extra configuration has one.
func standaloneNATSWith(t *testing.T, jobs map[string]creds.Credentials, extra string) string {
	t.Helper()
	buildNATSServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	var users []string
	for job, c := range jobs {
		subj := fmt.Sprintf(`[%q, "_INBOX.>"]`, protocol.JobSubjects(job))
		users = append(users, fmt.Sprintf(`{ user: %q, password: %q, permissions: { publish: %s, subscribe: %s } }`, c.User, c.Password, subj, subj))
	}
	conf := fmt.Sprintf("listen: 127.0.0.1:%d\nmax_payload: 8MB\nauthorization { users: [\n%s\n] }\n%s\n", port, strings.Join(users, "\n"), extra)
	dir := t.TempDir()
	confFile := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(confFile, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(natsServerBin, "-c", confFile)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Server is ready") {
				once.Do(func() { close(ready) })
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(20 * time.Second):
		t.Fatal("nats-server did not become ready")
	}
	if strings.Contains(extra, "tls") {
		return fmt.Sprintf("tls://127.0.0.1:%d", port)
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", port)
}

func writeCreds(t *testing.T, c creds.Credentials) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "job.creds")
	if err := creds.Write(f, c); err != nil {
		t.Fatal(err)
	}
	return f
}

// runNodes runs one launcher per node against url and returns their exit codes,
// log dirs and consoles.
func runNodes(t *testing.T, url, credsFile, job string, nodes, perNode int, workload ...string) ([]int, []string, []string) {
	return runNodesWith(t, url, credsFile, job, nodes, perNode, nil, workload...)
}

// runNodesWith is runNodes with extra launcher flags.
func runNodesWith(t *testing.T, url, credsFile, job string, nodes, perNode int, flags []string, workload ...string) ([]int, []string, []string) {
	t.Helper()
	codes, dirs, consoles := make([]int, nodes), make([]string, nodes), make([]string, nodes)
	var wg sync.WaitGroup
	for node := 0; node < nodes; node++ {
		dirs[node] = t.TempDir()
		wg.Add(1)
		go func(node int) {
			defer wg.Done()
			var out, errb bytes.Buffer
			args := append([]string{"run", "--nnodes", fmt.Sprint(nodes), "--node-rank", fmt.Sprint(node), "-n", fmt.Sprint(perNode),
				"--nats", url, "--nats-creds", credsFile, "--job-id", job, "--log-dir", dirs[node], "--grace", "2s",
				"--worker", worker()}, append(flags, workload...)...)
			codes[node] = Main(context.Background(), args, &out, &errb)
			consoles[node] = out.String() + errb.String()
		}(node)
	}
	wg.Wait()
	return codes, dirs, consoles
}

// TestTwoLaunchersComplete: a standalone NATS server and two launchers of 2
// ranks each run mlp and verify --quick to completion; both summaries report 4
// ranks and exit 0.
func TestTwoLaunchersComplete(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs nats-server")
	}
	jobs := map[string]creds.Credentials{
		"mlp-job":    {User: "job-mlp", Password: "pw-mlp"},
		"verify-job": {User: "job-verify", Password: "pw-verify"},
	}
	url := standaloneNATS(t, jobs)
	for job, workload := range map[string][]string{
		"mlp-job":    {"mlp", "--mesh", "dp=2,tp=2", "--tokens", "32", "--hidden", "16", "--steps", "3"},
		"verify-job": {"verify", "--quick"},
	} {
		codes, dirs, consoles := runNodes(t, url, writeCreds(t, jobs[job]), job, 2, 2, workload...)
		for node := range codes {
			if codes[node] != 0 {
				t.Fatalf("%s node %d: exit %d\n%s", job, node, codes[node], consoles[node])
			}
			sum := readJSON[Summary](t, filepath.Join(dirs[node], job, SummaryFile))
			if sum.WorldSize != 4 || sum.ExitCode != 0 || len(sum.Ranks) != 2 {
				t.Errorf("%s node %d summary: world %d, exit %d, %d local ranks", job, node, sum.WorldSize, sum.ExitCode, len(sum.Ranks))
			}
		}
		if !strings.Contains(consoles[0], `"loss_last"`) && !strings.Contains(consoles[0], "passed") {
			t.Errorf("%s: rank 0's result missing from node 0's console:\n%s", job, consoles[0])
		}
	}
}

// TestNATSRefusals: a job's NATS refuses clients without credentials, with wrong
// ones, and another job's user publishing into the job's subjects; the job it
// targets runs to completion meanwhile.
func TestNATSRefusals(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs nats-server")
	}
	a, b := creds.Credentials{User: "job-a", Password: "pw-a"}, creds.Credentials{User: "job-b", Password: "pw-b"}
	url := standaloneNATS(t, map[string]creds.Credentials{"job-a": a, "job-b": b})

	if nc, err := nats.Connect(url, nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Error("a client without credentials was admitted")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("no credentials: %v", err)
	}
	wrong := creds.Credentials{User: "job-a", Password: "guess"}
	if _, err := natsconn.Connect(natsconn.Config{URL: url, Creds: &wrong}); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("wrong credentials: %v", err)
	}

	// Job a runs while job b's user tries to publish into job a's subjects.
	done := make(chan struct{})
	var codes []int
	var consoles []string
	go func() {
		defer close(done)
		codes, _, consoles = runNodes(t, url, writeCreds(t, a), "job-a", 2, 1, "mlp", "--mesh", "tp=2", "--tokens", "32", "--hidden", "16", "--steps", "20")
	}()
	violations := make(chan error, 16)
	nc, err := natsconn.Connect(natsconn.Config{URL: url, Creds: &b},
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for _, subj := range []string{protocol.AbortSubject("job-a"), protocol.FailSubject("job-a"), protocol.RendezvousSubject("job-a")} {
		if err := nc.Publish(subj, []byte(`{"reason":"forged"}`)); err != nil {
			t.Fatal(err)
		}
	}
	nc.Flush()
	select {
	case err := <-violations:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Errorf("publishing into another job's subjects: %v", err)
		}
	case <-time.After(testtime.Scale(5 * time.Second)):
		t.Error("publishing into another job's subjects raised no permissions violation")
	}
	if _, err := nc.SubscribeSync(protocol.JobSubjects("job-a")); err == nil {
		nc.Flush()
		select {
		case err := <-violations:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Errorf("subscribing to another job's subjects: %v", err)
			}
		case <-time.After(testtime.Scale(5 * time.Second)):
			t.Error("subscribing to another job's subjects raised no permissions violation")
		}
	}
	<-done
	for node, code := range codes {
		if code != 0 {
			t.Errorf("job a, node %d: exit %d (it must be unaffected)\n%s", node, code, consoles[node])
		}
	}
}

// TestTLSNodes: the same two-launcher job over a NATS server that requires TLS:
// launchers and ranks verify its certificate against the job's CA; a plaintext
// client is refused.
func TestTLSNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs nats-server")
	}
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "nats")
	cert, key := ca.Issue(t, dir, "server")
	job := creds.Credentials{User: "job-tls", Password: "pw-tls"}
	url := standaloneNATSWith(t, map[string]creds.Credentials{"tls-job": job},
		fmt.Sprintf("tls { cert_file: %q, key_file: %q, ca_file: %q }", cert, key, ca.File))
	plain := strings.Replace(url, "tls://", "nats://", 1)
	if nc, err := nats.Connect(plain, nats.UserInfo(job.User, job.Password), nats.Timeout(2*time.Second)); err == nil {
		nc.Close()
		t.Error("a plaintext client was admitted by a server that requires TLS")
	}
	codes, dirs, consoles := runNodesWith(t, url, writeCreds(t, job), "tls-job", 2, 2, []string{"--nats-ca", ca.File},
		"mlp", "--mesh", "tp=4", "--tokens", "16", "--hidden", "8", "--steps", "2")
	for node := range codes {
		if codes[node] != 0 {
			t.Fatalf("node %d: exit %d\n%s", node, codes[node], consoles[node])
		}
		if sum := readJSON[Summary](t, filepath.Join(dirs[node], "tls-job", SummaryFile)); sum.WorldSize != 4 || sum.ExitCode != 0 {
			t.Errorf("node %d summary: %+v", node, sum)
		}
	}
	// Without the CA the launcher cannot verify the server and stops before any rank starts.
	codes, _, consoles = runNodes(t, url, writeCreds(t, job), "tls-job-2", 1, 1, "hello")
	if codes[0] == 0 || !strings.Contains(consoles[0], "certificate") {
		t.Errorf("unverifiable server: exit %d\n%s", codes[0], consoles[0])
	}
}

// TestTwoNodesRestart: two launchers restart together after a rank of node 1
// fails once; every attempt's ranks on both nodes get the same MASTER_ADDR and
// MASTER_PORT (node 0's, handed out over NATS), a new port per attempt.
func TestTwoNodesRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs nats-server")
	}
	jobs := map[string]creds.Credentials{"restart-job": {User: "job-restart", Password: "pw-restart"}}
	url := standaloneNATS(t, jobs)
	script := `echo "master $MASTER_ADDR:$MASTER_PORT attempt $TORCHELASTIC_RESTART_COUNT"; ` +
		`if [ "$RANK" = 1 ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exit 3; fi; sleep 0.2`
	codes, dirs, consoles := runNodesWith(t, url, writeCreds(t, jobs["restart-job"]), "restart-job", 2, 1,
		[]string{"--max-restarts", "1"}, "--", "sh", "-c", script)
	masters := map[string]bool{}
	for node := range codes {
		if codes[node] != 0 {
			t.Fatalf("node %d: exit %d\n%s", node, codes[node], consoles[node])
		}
		sum := readJSON[Summary](t, filepath.Join(dirs[node], "restart-job", SummaryFile))
		if len(sum.Attempts) != 2 || sum.Reason != OutcomeOK {
			t.Errorf("node %d summary: %+v", node, sum)
		}
		for a, sub := range []string{".", AttemptDir(1)} {
			b, _ := os.ReadFile(filepath.Join(dirs[node], "restart-job", sub, RankDir(node), "stdout.log"))
			i := bytes.Index(b, []byte("master "))
			if i < 0 || !bytes.Contains(b, []byte(fmt.Sprintf("attempt %d", a))) {
				t.Fatalf("node %d attempt %d printed %q", node, a, b)
			}
			masters[fmt.Sprintf("%d %s", a, bytes.Fields(b[i:])[1])] = true
		}
	}
	if len(masters) != 2 {
		t.Errorf("MASTER_ADDR:MASTER_PORT per attempt, both nodes: %v (want one per attempt, a new port each)", masters)
	}
	if s := readJSON[Summary](t, filepath.Join(dirs[1], "restart-job", SummaryFile)); s.Attempts[0].Reason != OutcomeRankFailed {
		t.Errorf("node 1's attempt 0: %+v", s.Attempts[0])
	}
}
