package bootstrap_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/collective/ncclfake"
	"github.com/meshrun/meshrun/natsrv"
	"github.com/meshrun/meshrun/tensor"
)

// Fault tests with real processes: the test binary re-executes itself as the
// workers of a job (TestMain), on loopback with an embedded NATS server.

func TestMain(m *testing.M) {
	if os.Getenv("MESHRUN_TEST_WORKER") != "" {
		os.Exit(worker())
	}
	os.Exit(m.Run())
}

// workerResult is what a worker prints as its last line.
type workerResult struct {
	Rank    int    `json:"rank"`
	Iters   int    `json:"iters"`
	Err     string `json:"err,omitempty"`
	Kind    string `json:"kind,omitempty"`
	Culprit int    `json:"culprit"`
	At      int64  `json:"at_ms"` // unix ms when the error was returned
	Wrong   string `json:"wrong,omitempty"`
	Leaked  int    `json:"leaked"`
}

func kindName(err error) string {
	for _, k := range []error{collective.ErrPeerLost, collective.ErrMismatch, collective.ErrTimeout, collective.ErrAborted, collective.ErrControlLost, collective.ErrRendezvous, collective.ErrClosed} {
		if errors.Is(err, k) {
			return k.Error()
		}
	}
	return "untyped"
}

func worker() int {
	base := runtime.NumGoroutine()
	cfg := bootstrap.EnvConfig()
	cfg.HeartbeatTimeout = 2 * time.Second
	cfg.HeartbeatInterval = 250 * time.Millisecond
	cfg.DataTimeout = 10 * time.Second
	if os.Getenv("MESHRUN_TEST_NCCL") != "" {
		cfg.Options = collectivetest.NCCLOptions(cfg.Options, ncclfake.Options{})
	}
	out := bufio.NewWriter(os.Stdout)
	res := workerResult{Rank: cfg.Rank, Culprit: -1}
	emit := func() int {
		b, _ := json.Marshal(res)
		fmt.Fprintf(out, "%s\n", b)
		out.Flush()
		return 0
	}
	w, err := bootstrap.Join(context.Background(), cfg)
	if err != nil {
		res.Err, res.Kind, res.Culprit, res.At = err.Error(), kindName(err), collective.Culprit(err), time.Now().UnixMilli()
		return emit()
	}
	fault := os.Getenv("MESHRUN_TEST_FAULT")
	c, err := w.WorldGroup(context.Background())
	allReduce := func(buf []float32) error { return collective.AllReduce(context.Background(), c, buf, collective.Sum) }
	if os.Getenv("MESHRUN_TEST_NCCL") != "" {
		// The nccl backend over the fake library, on sim device buffers.
		mem := collectivetest.NCCL.Memories(cfg.Rank + 1)[cfg.Rank]
		var dc collective.Communicator
		if err == nil {
			dc, err = w.Communicator(context.Background(), c.Ranks(), mem)
		}
		allReduce = func(buf []float32) error {
			h, _ := tensor.FromFloat32(buf, len(buf))
			d, err := tensor.Upload(mem, h)
			if err == nil {
				err = dc.AllReduce(context.Background(), d, collective.Sum)
			}
			if err == nil {
				h, err = tensor.Download(d)
			}
			if err == nil {
				copy(buf, h.Float32())
			}
			return err
		}
	}
	buf := make([]float32, 256<<10)
	start := time.Now()
	for it := 0; err == nil && time.Since(start) < 30*time.Second; it++ {
		for i := range buf {
			buf[i] = float32((cfg.Rank + it + i) % 7)
		}
		err = allReduce(buf)
		if err != nil {
			break
		}
		for i := range buf {
			want := 0
			for r := 0; r < cfg.WorldSize; r++ {
				want += (r + it + i) % 7
			}
			if buf[i] != float32(want) {
				res.Wrong = fmt.Sprintf("iteration %d element %d = %v, want %d", it, i, buf[i], want)
				return emit()
			}
		}
		res.Iters = it + 1
		if it == 2 {
			fmt.Fprintln(out, "ready")
			out.Flush()
			if fault == "exit" && cfg.Rank == 2 {
				go func() {
					time.Sleep(200 * time.Millisecond)
					os.Exit(3)
				}()
			}
		}
	}
	if err != nil {
		res.Err, res.Kind, res.Culprit, res.At = err.Error(), kindName(err), collective.Culprit(err), time.Now().UnixMilli()
	}
	w.Close()
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	res.Leaked = runtime.NumGoroutine() - base
	return emit()
}

type proc struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan struct{}
}

func startJob(t *testing.T, s *natsrv.Server, job string, n int, transport, fault string) []*proc {
	t.Helper()
	c, _ := s.Credentials(job)
	path := filepath.Join(t.TempDir(), "creds")
	if err := creds.Write(path, c); err != nil {
		t.Fatal(err)
	}
	procs := make([]*proc, n)
	for r := 0; r < n; r++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(),
			"MESHRUN_TEST_WORKER=1", "MESHRUN_TEST_FAULT="+fault,
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n), "LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE="+strconv.Itoa(n),
			"NODE_RANK=0", "NNODES=1", "MESHRUN_JOB_ID="+job, "MESHRUN_NATS_URL="+s.URL(), "MESHRUN_NATS_CREDS="+path,
			"MESHRUN_TRANSPORT="+transport)
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p := &proc{cmd: cmd, lines: make(chan string, 16), done: make(chan struct{})}
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				p.lines <- sc.Text()
			}
			close(p.lines)
			cmd.Wait() // reap at once: a zombie would still look alive
			close(p.done)
		}()
		procs[r] = p
	}
	t.Cleanup(func() {
		for _, p := range procs {
			p.cmd.Process.Signal(syscall.SIGCONT)
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return procs
}

func waitReady(t *testing.T, procs []*proc) {
	t.Helper()
	for r, p := range procs {
		select {
		case l := <-p.lines:
			if l != "ready" {
				t.Fatalf("rank %d: %s", r, l)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("rank %d never got going", r)
		}
	}
}

func result(t *testing.T, r int, p *proc, limit time.Duration) workerResult {
	t.Helper()
	var res workerResult
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatalf("rank %d exited without a result", r)
		}
		if err := json.Unmarshal([]byte(l), &res); err != nil {
			t.Fatalf("rank %d: %q", r, l)
		}
	case <-time.After(limit):
		t.Fatalf("rank %d: no result within %v", r, limit)
	}
	if res.Wrong != "" {
		t.Fatalf("rank %d returned a wrong result: %s", r, res.Wrong)
	}
	if res.Leaked > 0 {
		t.Errorf("rank %d leaked %d goroutines", r, res.Leaked)
	}
	return res
}

func TestProcessFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	const n, victim = 4, 2
	cases := []struct {
		name, transport, fault string
		kind                   error
		culprit                int
		limit                  time.Duration // from the fault to every survivor's error
	}{
		{"exit/tcp", "tcp", "exit", collective.ErrPeerLost, victim, 2 * time.Second},
		{"exit/shm", "shm", "exit", collective.ErrPeerLost, victim, 2 * time.Second},
		{"sigkill/tcp", "tcp", "kill", collective.ErrPeerLost, victim, 2 * time.Second},
		{"sigkill/shm", "shm", "kill", collective.ErrPeerLost, victim, 2 * time.Second},
		{"sigkill/nats", "nats", "kill", collective.ErrPeerLost, victim, 4 * time.Second}, // heartbeat timeout 2 s + 2 s
		{"sigstop/shm", "shm", "stop", collective.ErrPeerLost, victim, 4 * time.Second},
		{"sigstop/tcp", "tcp", "stop", collective.ErrPeerLost, victim, 4 * time.Second},
		{"nats-restart/tcp", "tcp", "restart", collective.ErrControlLost, -1, 2 * time.Second},
		// The nccl backend over the fake library on sim buffers: the rank
		// lost while its peers wait on the library.
		{"exit/shm/nccl", "shm", "exit", collective.ErrPeerLost, victim, 2 * time.Second},
		{"sigkill/shm/nccl", "shm", "kill", collective.ErrPeerLost, victim, 2 * time.Second},
		{"sigstop/tcp/nccl", "tcp", "stop", collective.ErrPeerLost, victim, 4 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if strings.HasSuffix(tc.name, "/nccl") {
				t.Setenv("MESHRUN_TEST_NCCL", "1")
			}
			job := bootstraptest.NewJob()
			s, err := natsrv.Start(natsrv.Options{Jobs: []string{job}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { s.Shutdown() }()
			var rdv *bootstraptest.RendezvousWatch
			if tc.transport == "shm" {
				rdv = bootstraptest.WatchRendezvous(t, s)
			}
			procs := startJob(t, s, job, n, tc.transport, tc.fault)
			waitReady(t, procs)
			var t0 time.Time
			switch tc.fault {
			case "exit":
				t0 = time.Now().Add(200 * time.Millisecond) // the victim exits 200 ms after "ready"
			case "kill":
				t0 = time.Now()
				procs[victim].cmd.Process.Signal(syscall.SIGKILL)
			case "stop":
				t0 = time.Now()
				procs[victim].cmd.Process.Signal(syscall.SIGSTOP)
			case "restart":
				port, admin, jobs := s.Port(), s.Admin(), s.JobCreds()
				t0 = time.Now()
				s.Shutdown()
				s, err = natsrv.Start(natsrv.Options{Port: port, Admin: &admin, JobCreds: jobs})
				if err != nil {
					t.Fatal(err)
				}
			}
			for r, p := range procs {
				if r == victim && tc.fault != "restart" {
					continue
				}
				res := result(t, r, p, tc.limit+5*time.Second)
				took := time.UnixMilli(res.At).Sub(t0)
				t.Logf("rank %d after %d iterations, %v after the fault: %s", r, res.Iters, took.Round(time.Millisecond), res.Err)
				if res.Kind != tc.kind.Error() || res.Culprit != tc.culprit {
					t.Errorf("rank %d: %s (culprit %d), want %v naming %d", r, res.Err, res.Culprit, tc.kind, tc.culprit)
				}
				if took > tc.limit {
					t.Errorf("rank %d failed %v after the fault, limit %v", r, took, tc.limit)
				}
				if tc.fault == "restart" && !strings.Contains(res.Err, "NATS") {
					t.Errorf("rank %d: error does not name the NATS server: %s", r, res.Err)
				}
			}
			if rdv != nil {
				// Rings and arenas are unlinked once setup is over: a rank
				// killed in the middle of collectives leaves nothing behind.
				if left := bootstraptest.LeftRings(rdv.RosterSeen(t), nil); len(left) > 0 {
					t.Errorf("left in /dev/shm after the %s: %v", tc.fault, left)
				}
			}
		})
	}
}

func TestProcessNeverJoins(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	job := bootstraptest.NewJob()
	s := bootstraptest.StartServer(t, job)
	// World of 4 but only 3 processes; rendezvous timeout 2 s via the env.
	t.Setenv("MESHRUN_RENDEZVOUS_TIMEOUT", "2s")
	procs := startJob(t, s, job, 4, "tcp", "none")
	procs[3].cmd.Process.Kill() // rank 3 never joins
	for r := 0; r < 3; r++ {
		res := result(t, r, procs[r], 10*time.Second)
		if res.Kind != collective.ErrRendezvous.Error() || !strings.Contains(res.Err, "missing ranks [3]") {
			t.Errorf("rank %d: %s", r, res.Err)
		}
	}
}
