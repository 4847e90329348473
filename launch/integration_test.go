package launch

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/meshrun/meshrun/internal/testtime"
	"github.com/meshrun/meshrun/logview"
	"github.com/meshrun/meshrun/natsrv"
)

// ranktest is the test rank program (testdata/ranktest): it joins, runs
// barriers with runlog spans and progress, and fails as told.
func ranktest() string { return filepath.Join(bin, "ranktest") }

// TestRankFailsMidRun: rank 2 exits 3 at its fifth step, blocked peers are
// told, and the launcher exits 3 within grace + 2 s naming rank 2 everywhere.
func TestRankFailsMidRun(t *testing.T) {
	code, dir, _, stderr := launch(t, "-n", "4", "--", ranktest(), "-steps", "1000", "-fail-rank", "2", "-fail-code", "3", "-at", "5")
	ended := time.Now()
	if code != 3 {
		t.Fatalf("exit %d, want 3; stderr:\n%s", code, stderr)
	}
	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	rc := sum.RootCause
	if rc != nil {
		// From the failure to the launcher's exit: within grace (2 s) + 2 s.
		if d := ended.Sub(time.UnixMilli(rc.TimeMS)); d > 2*time.Second+testtime.Scale(2*time.Second) {
			t.Errorf("the launcher exited %v after the failure", d)
		}
	}
	if rc == nil || rc.Rank != 2 || rc.Node != 0 || rc.ExitCode != 3 || rc.TimeMS == 0 || rc.Error != "injected failure" {
		t.Fatalf("summary root cause: %+v", rc)
	}
	if fmt.Sprint(sum.Victims) != "[0 1 3]" {
		t.Errorf("victims %v", sum.Victims)
	}
	// Each rank's folder is rank-NNNNN, its global rank zero-padded to 5
	// digits (docs/launcher.md): what scripts and logs why read.
	var folders []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			folders = append(folders, e.Name())
		}
	}
	if fmt.Sprint(folders) != "[rank-00000 rank-00001 rank-00002 rank-00003]" {
		t.Errorf("rank folders %v, want rank-00000 to rank-00003", folders)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "rank-00002", "stderr.log")); err != nil || !bytes.Contains(b, []byte("injected failure at step 5")) {
		t.Errorf("rank-00002/stderr.log: %v %q", err, b)
	}
	for _, r := range sum.Ranks {
		if !groupGone(r.PID) {
			t.Errorf("rank %d's process group still has processes", r.Rank)
		}
	}
	var out, errb bytes.Buffer
	if c := launcherMain(context.Background(), []string{"logs", "why", "--log-dir", filepath.Dir(dir), filepath.Base(dir)}, &out, &errb); c != 0 {
		t.Fatalf("logs why: exit %d: %s", c, errb.String())
	}
	why := out.String()
	for _, want := range []string{"root cause: rank 2 on node 0 exited with code 3", "error: injected failure",
		"last lines of rank 2:", "injected failure at step 5", "victims (torn down, not the cause): ranks 0-1,3"} {
		if !strings.Contains(why, want) {
			t.Errorf("logs why lacks %q:\n%s", want, why)
		}
	}
	// The victims' section comes after the root cause's.
	if strings.Index(why, "victims") < strings.Index(why, "root cause") {
		t.Errorf("victims before the root cause:\n%s", why)
	}
}

// TestRankKilledByRanktest: a rank that SIGKILLs itself in the middle of a
// collective loop gives 137.
func TestRankKilledMidRun(t *testing.T) {
	code, dir, _, stderr := launch(t, "-n", "3", "--", ranktest(), "-steps", "1000", "-kill-rank", "1", "-at", "4")
	if code != 137 {
		t.Fatalf("exit %d, want 137; stderr:\n%s", code, stderr)
	}
	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	if sum.RootCause == nil || sum.RootCause.Rank != 1 || sum.RootCause.Signal != "SIGKILL" {
		t.Errorf("root cause %+v", sum.RootCause)
	}
}

// TestHangNamed stops a rank with SIGSTOP while the others loop on barriers:
// --hang-after names it, with the collective and its sequence number, and the
// other ranks write their goroutine stacks.
func TestHangNamed(t *testing.T) {
	logDir := t.TempDir()
	var out, errb bytes.Buffer
	res := make(chan int, 1)
	go func() {
		res <- Main(context.Background(), []string{"run", "--log-dir", logDir, "--job-id", "hang", "--grace", "1s",
			"--hang-after", "1s", "-n", "4", "--", ranktest(), "-steps", "0"}, &out, &errb)
	}()
	dir := filepath.Join(logDir, "hang")
	rec := waitJobRecord(t, dir)
	// Wait until the ranks are in their barrier loop.
	waitFor(t, 20*time.Second, "progress", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, RankDir(2), "stdout.log"))
		return bytes.Count(b, []byte("@meshrun:progress")) >= 3
	})
	pid := rec.Ranks[2].PID
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	var code int
	select {
	case code = <-res:
	case <-time.After(testtime.Scale(40 * time.Second)):
		t.Fatal("the launcher did not end")
	}
	if code == 0 {
		t.Errorf("exit 0 with a stopped rank")
	}
	stderr := errb.String()
	if !strings.Contains(stderr, "launcher: hang: barrier seq ") || !strings.Contains(stderr, fmt.Sprintf("missing: rank 2 (pid %d, T (stopped))", pid)) {
		t.Errorf("console does not name the stopped rank:\n%s", stderr)
	}
	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	named := false
	for _, h := range sum.Hangs { // a loaded machine may add a slow barrier or two
		named = named || fmt.Sprint(h.Missing) == "[2]" && h.Op == "barrier" && h.Seq > 0 && h.States["2"] == "T (stopped)"
	}
	if !named {
		t.Errorf("summary hangs: %+v", sum.Hangs)
	}
	ev, _ := os.ReadFile(filepath.Join(dir, EventsFile))
	if !bytes.Contains(ev, []byte(`"event":"hang"`)) || !bytes.Contains(ev, []byte(`"missing":[2]`)) {
		t.Errorf("events.jsonl has no hang naming rank 2:\n%s", ev)
	}
	for _, r := range []int{0, 1, 3} {
		m, _ := filepath.Glob(filepath.Join(dir, RankDir(r), "stacks-*.txt"))
		if len(m) == 0 {
			t.Errorf("rank %d wrote no stacks", r)
			continue
		}
		if b, _ := os.ReadFile(m[0]); !bytes.Contains(b, []byte("goroutine ")) {
			t.Errorf("rank %d stacks: %q", r, b)
		}
	}
	if !groupGone(pid) {
		t.Errorf("the stopped rank survived the teardown")
	}
}

// TestRendezvousMissingRank: a rank that never joins fails the rendezvous,
// and the error names it.
func TestRendezvousMissingRank(t *testing.T) {
	t.Setenv("MESHRUN_RENDEZVOUS_TIMEOUT", "4s") // long enough for ranks 0 and 1 on a loaded machine
	code, dir, stdout, stderr := launch(t, "-n", "3", "--", ranktest(), "-stall-rank", "2")
	if code == 0 {
		t.Fatalf("exit 0; stderr:\n%s", stderr)
	}
	if !strings.Contains(stderr, "missing ranks [2]") {
		t.Errorf("console does not name the missing rank:\nstdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	// Rank 0 (the coordinator) blames rank 2 by number; the others relay its
	// answer. Whichever exits first, the evidence names rank 2, which never
	// joined and was still running: the root cause, hung.
	if rc := sum.RootCause; rc == nil || rc.Rank != 2 || !rc.Hung || !strings.Contains(rc.Error, "never joined the job") ||
		rc.ReportedBy == nil || !strings.HasPrefix(rc.Evidence, evidenceBlamed) || slices.Contains(sum.Victims, 2) {
		t.Errorf("root cause %+v, victims %v", rc, sum.Victims)
	}
}

// TestProgressLogsTrace runs a short job and reads it back: the progress line,
// log.jsonl on every rank, `launcher logs` and a merged trace.
func TestProgressLogsTrace(t *testing.T) {
	code, dir, stdout, stderr := launch(t, "-n", "3", "--", ranktest(), "-steps", "5", "-warn")
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	if !strings.Contains(stdout, "progress: step 5/5") || strings.Contains(stdout, "@meshrun:") {
		t.Errorf("console progress:\n%s", stdout)
	}
	if !strings.Contains(stderr, "ranks[0-2]: WARN the same warning on every rank") {
		t.Errorf("the warning is not collapsed:\n%s", stderr)
	}
	logDir, job := filepath.Dir(dir), filepath.Base(dir)
	run := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if c := launcherMain(context.Background(), append(args, "--log-dir", logDir), &out, &errb); c != 0 {
			t.Fatalf("%v: exit %d: %s", args, c, errb.String())
		}
		return out.String()
	}
	all := run("logs", job)
	if strings.Count(all, "WARN the same warning") != 3 {
		t.Errorf("logs: want the warning once per rank:\n%s", all)
	}
	if got := run("logs", "latest", "--collapse", "--level", "warn"); strings.TrimSpace(got) == "" ||
		!strings.HasSuffix(strings.TrimSpace(got), "ranks[0-2]: WARN the same warning on every rank") {
		t.Errorf("logs --collapse --level warn:\n%s", got)
	}
	if got := run("logs", job, "--rank", "1", "--grep", "progress", "--tail", "2"); strings.Count(got, "0:1| INFO progress") != 2 || strings.Count(got, "\n") != 2 {
		t.Errorf("logs --rank 1 --grep progress --tail 2:\n%s", got)
	}
	js := run("logs", job, "--json", "--rank", "0")
	sc := bufio.NewScanner(strings.NewReader(js))
	last := int64(0)
	for sc.Scan() {
		var e logview.Entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Rank != 0 || e.TimeMS < last {
			t.Fatalf("logs --json line %q: %v (not in time order?)", sc.Text(), err)
		}
		last = e.TimeMS
	}
	// The merged trace is Chrome trace JSON with one process per rank.
	traceFile := filepath.Join(t.TempDir(), "trace.json")
	run("trace", job, "-o", traceFile)
	b, err := os.ReadFile(traceFile)
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		TraceEvents []map[string]any `json:"traceEvents"`
	}
	if err := json.Unmarshal(b, &tr); err != nil {
		t.Fatalf("merged trace is not JSON: %v", err)
	}
	names := map[float64]string{}
	spans := map[float64]int{}
	for _, e := range tr.TraceEvents {
		pid, ok := e["pid"].(float64)
		if !ok || e["ph"] == nil || e["name"] == nil {
			t.Fatalf("event without pid, ph or name: %v", e)
		}
		switch e["ph"] {
		case "M":
			if e["name"] == "process_name" {
				names[pid] = e["args"].(map[string]any)["name"].(string)
			}
		case "X":
			if _, ok := e["ts"].(float64); !ok {
				t.Fatalf("span without ts: %v", e)
			}
			if _, ok := e["dur"].(float64); !ok {
				t.Fatalf("span without dur: %v", e)
			}
			spans[pid]++
		}
	}
	if len(names) != 3 || names[0] != "rank 0 (node 0)" || names[2] != "rank 2 (node 0)" {
		t.Errorf("processes %v, want one per rank", names)
	}
	for r := 0; r < 3; r++ {
		if spans[float64(r)] < 6 { // join + 5 barriers
			t.Errorf("rank %d has %d spans", r, spans[float64(r)])
		}
	}
}

// TestTwoNodes runs two launchers meeting through one NATS server on
// loopback: ranks 0-1 on node 0, 2-3 on node 1. Rank 3 fails; both launchers
// exit with its code and name it, node and all.
func TestTwoNodes(t *testing.T) {
	const job = "twonodes"
	srv, err := natsrv.Start(natsrv.Options{Jobs: []string{job}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	credsFile := filepath.Join(t.TempDir(), "job.creds")
	if err := srv.WriteCredentials(job, credsFile); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	codes := make([]int, 2)
	dirs := make([]string, 2)
	errs := make([]*bytes.Buffer, 2)
	for node := 0; node < 2; node++ {
		dirs[node] = t.TempDir()
		errs[node] = &bytes.Buffer{}
		wg.Add(1)
		go func(node int) {
			defer wg.Done()
			var out bytes.Buffer
			codes[node] = Main(context.Background(), []string{"run", "--nnodes", "2", "--node-rank", fmt.Sprint(node), "-n", "2",
				"--nats", srv.URL(), "--nats-creds", credsFile, "--job-id", job, "--log-dir", dirs[node], "--grace", "2s",
				"--", ranktest(), "-steps", "1000", "-fail-rank", "3", "-fail-code", "3", "-at", "5"}, &out, errs[node])
		}(node)
	}
	wg.Wait()
	for node := 0; node < 2; node++ {
		if codes[node] != 3 {
			t.Errorf("node %d: exit %d, want 3; stderr:\n%s", node, codes[node], errs[node])
			continue
		}
		sum := readJSON[Summary](t, filepath.Join(dirs[node], job, SummaryFile))
		if rc := sum.RootCause; rc == nil || rc.Rank != 3 || rc.Node != 1 || rc.ExitCode != 3 {
			t.Errorf("node %d root cause %+v", node, rc)
		}
		rec := readJSON[JobRecord](t, filepath.Join(dirs[node], job, JobFile))
		if rec.World != 4 || rec.NodeRank != node || len(rec.Ranks) != 2 || rec.Ranks[0].Rank != 2*node {
			t.Errorf("node %d job.json: %+v", node, rec)
		}
	}
	if !strings.Contains(errs[0].String(), "rank 3 on node 1 failed") {
		t.Errorf("node 0 does not say that rank 3 on node 1 failed:\n%s", errs[0])
	}
}

func TestConsoleFilter(t *testing.T) {
	code, _, stdout, stderr := launch(t, "-n", "3", "--console", "1", "hello")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "0:1| hello from rank 1") || strings.Contains(stdout, "0:0|") || strings.Contains(stdout, "0:2|") {
		t.Errorf("--console 1:\n%s", stdout)
	}
}

func TestRunNewFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"nnodes without nats", []string{"--nnodes", "2", "hello"}, []string{"--nats URL", "--job-id"}},
		{"node rank", []string{"--nnodes", "2", "--node-rank", "2", "--nats", "nats://127.0.0.1:1", "--nats-creds", "x", "--job-id", "j", "hello"}, []string{"--node-rank 2"}},
		{"console", []string{"--console", "0,x", "hello"}, []string{"--console"}},
		{"device", []string{"--device", "tpu", "hello"}, []string{"--device"}},
		{"gpu without cuda", []string{"-n", "gpu", "hello"}, []string{"--nproc-per-node gpu"}},
		{"hang-after", []string{"--hang-after", "-1s", "hello"}, []string{"--hang-after"}},
		{"plaintext to a remote NATS", []string{"--nats", "nats://nats.example.org:4222", "--nats-creds", "x", "--job-id", "j", "hello"},
			[]string{"not on loopback and not TLS", "--insecure"}},
		{"TLS files without --nats", []string{"--nats-ca", "ca.pem", "hello"}, []string{"without --nats"}},
		{"client cert without key", []string{"--nats", "tls://nats.example.org:4222", "--nats-creds", "x", "--nats-cert", "c.pem", "--job-id", "j", "hello"},
			[]string{"both the certificate and its key"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "gpu without cuda" {
				if _, err := gpuCount(); err == nil {
					t.Skip("a cuda build")
				}
			}
			var out, errb bytes.Buffer
			if code := Main(context.Background(), append([]string{"run"}, tc.args...), &out, &errb); code != ExitUsage {
				t.Errorf("exit %d, want %d", code, ExitUsage)
			}
			for _, w := range tc.want {
				if !strings.Contains(errb.String(), w) {
					t.Errorf("%q lacks %q", errb.String(), w)
				}
			}
		})
	}
	env := map[string]string{"MESHRUN_HANG_AFTER": "2s", "MESHRUN_CONSOLE": "0,4-7", "MESHRUN_NNODES": "3", "MESHRUN_NODE_RANK": "1", "MESHRUN_DEVICE": "cuda"}
	o, err := ParseRunFlags([]string{"hello"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if o.HangAfter != 2*time.Second || o.Console != "0,4-7" || o.NNodes != 3 || o.NodeRank != 1 || o.Device != "cuda" {
		t.Errorf("from MESHRUN_*: %+v", o)
	}
}

// TestRunDeviceCUDA: one GPU per rank through CUDA_VISIBLE_DEVICES, drawn from
// the launcher's own list; runlog's variables and MESHRUN_DEVICE are set. A
// build without CUDA refuses --device cuda, so the test stands in for a cuda
// build (pretendCUDA).
func TestRunDeviceCUDA(t *testing.T) {
	pretendCUDA(t)
	t.Setenv("CUDA_VISIBLE_DEVICES", "3,5")
	code, dir, stdout, stderr := launch(t, "-n", "2", "--device", "cuda", "--", "sh", "-c", `echo "gpu=$CUDA_VISIBLE_DEVICES node=$MESHRUN_NODE dir=$MESHRUN_RANK_DIR device=$MESHRUN_DEVICE"`)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for r, gpu := range []string{"3", "5"} {
		abs, _ := filepath.Abs(filepath.Join(dir, RankDir(r)))
		want := fmt.Sprintf("0:%d| gpu=%s node=0 dir=%s device=cuda\n", r, gpu, abs)
		if !strings.Contains(stdout, want) {
			t.Errorf("console lacks %q:\n%s", want, stdout)
		}
	}
	rec := readJSON[JobRecord](t, filepath.Join(dir, JobFile))
	if rec.Device != "cuda" || rec.Env[EnvDevice] != "cuda" || len(rec.Ranks) != 2 || rec.Ranks[0].GPU != "3" || rec.Ranks[1].GPU != "5" {
		t.Errorf("job.json: %+v", rec)
	}
}

// waitFor waits for ok, at most d (scaled: testtime).
func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(testtime.Scale(d))
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitJobRecord(t *testing.T, dir string) JobRecord {
	t.Helper()
	var rec JobRecord
	waitFor(t, 20*time.Second, "job.json", func() bool {
		b, err := os.ReadFile(filepath.Join(dir, JobFile))
		return err == nil && json.Unmarshal(b, &rec) == nil
	})
	return rec
}

// TestLogsFollow follows a running job until it ends.
func TestLogsFollow(t *testing.T) {
	logDir := t.TempDir()
	res := make(chan int, 1)
	go func() {
		var out, errb bytes.Buffer
		res <- Main(context.Background(), []string{"run", "--log-dir", logDir, "--job-id", "follow", "-n", "2",
			"--", ranktest(), "-steps", "40"}, &out, &errb)
	}()
	waitJobRecord(t, filepath.Join(logDir, "follow"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	if c := launcherMain(ctx, []string{"logs", "follow", "-f", "--log-dir", logDir, "--rank", "0", "--grep", `^done$|"step":40,`}, &out, &errb); c != 0 {
		t.Fatalf("logs -f: exit %d: %s", c, errb.String())
	}
	if code := <-res; code != 0 {
		t.Fatalf("job exit %d", code)
	}
	if ctx.Err() != nil {
		t.Fatal("logs -f did not stop when the job ended")
	}
	got := out.String()
	if !strings.Contains(got, `0:0| INFO progress {"loss":0.025,"step":40,`) || !strings.Contains(got, "0:0| done\n") {
		t.Errorf("logs -f:\n%s", got)
	}
}
