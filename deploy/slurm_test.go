package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSlurmLocal submits slurm/meshrun-cpu.sbatch with sbatch to a real Slurm
// cluster of one machine: slurm/test-local.sh installs Debian's slurm-wlm and
// munge when slurmctld is missing, starts munged, slurmctld and two slurmd
// ("node0", "node1") on this machine, submits three jobs as an unprivileged
// user (an mlp whose batch script starts the job's own NATS server, a verify
// against a "site" NATS server given in MESHRUN_NATS, an mlp with a flag the
// worker refuses, a rank that exits 3), waits for them and stops everything. This test builds the
// binaries, runs the script and checks, from the files it keeps, each job's
// state and exit code, both launchers' output and each node's summary.json,
// and that nothing the script started is left.
//
// It needs root (skipped otherwise, and with -short); the script's exit 77
// (Slurm cannot be installed or started here) skips it with the script's reason.
func TestSlurmLocal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Slurm cluster (slurm/test-local.sh)")
	}
	if runtime.GOOS != "linux" {
		t.Skip("slurm/test-local.sh needs Linux")
	}
	if os.Geteuid() != 0 {
		t.Skip("slurm/test-local.sh needs root: it installs Slurm and starts munged, slurmctld and slurmd")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	began := time.Now()
	bin := t.TempDir()
	for _, args := range [][]string{
		{"build", "-o", bin + "/", "./cmd/..."},
		{"build", "-o", filepath.Join(bin, "nats-server"), "github.com/nats-io/nats-server/v2"},
	} {
		cmd := exec.Command("go", args...)
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	// Installing Slurm takes a minute or more; a cluster that is there, seconds.
	// The script ends within the test's own deadline (go test -timeout): apt-get
	// gets a third of what is left, the jobs a third.
	limit := 5 * time.Minute
	if _, err := exec.LookPath("slurmctld"); err != nil {
		limit = 15 * time.Minute
	}
	if d, ok := t.Deadline(); ok && time.Until(d)-30*time.Second < limit {
		limit = time.Until(d) - 30*time.Second
	}
	if limit < time.Minute {
		t.Skipf("%v left before the test's deadline: too little to start a Slurm cluster", limit)
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	keep := t.TempDir()
	cmd := exec.CommandContext(ctx, "bash", "slurm/test-local.sh")
	cmd.Env = append(os.Environ(), "MESHRUN_BIN="+bin, "MESHRUN_TEST_KEEP="+keep,
		fmt.Sprintf("MESHRUN_TEST_APT_TIMEOUT=%d", int(limit.Seconds()/3)),
		fmt.Sprintf("MESHRUN_TEST_JOB_TIMEOUT=%d", int(limit.Seconds()/3)))
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) } // the script stops its daemons
	cmd.WaitDelay = 30 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	console := out.String()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 77 {
		t.Logf("slurm/test-local.sh:\n%s", console) // the daemons' logs, where they did not come up
		lines := strings.Split(strings.TrimSpace(console), "\n")
		t.Skipf("slurm/test-local.sh cannot run here: %s", strings.TrimPrefix(lines[len(lines)-1], "cannot run: "))
	}
	t.Logf("slurm/test-local.sh: %v in %.1f s (whole test %.1f s):\n%s", err, took.Seconds(), time.Since(began).Seconds(), console)
	if err != nil {
		t.Fatalf("slurm/test-local.sh: %v", err)
	}

	// Nothing of the cluster is left: its folder is gone and no process
	// refers to it.
	tmp := regexp.MustCompile(`\((/tmp/meshrun-slurm\.[A-Za-z0-9]+)\)`).FindStringSubmatch(console)
	if tmp == nil {
		t.Fatal("the script did not name its folder")
	}
	if _, err := os.Stat(tmp[1]); !os.IsNotExist(err) {
		t.Errorf("%s is still there (%v)", tmp[1], err)
	}
	if procs := processesUsing(tmp[1]); len(procs) > 0 {
		t.Errorf("processes left running from %s:\n%s", tmp[1], strings.Join(procs, "\n"))
	}

	// The jobs, as the script submitted them and as scontrol saw them end.
	ids := map[string]string{}
	for _, m := range regexp.MustCompile(`submitted (\w+) as job (\d+)`).FindAllStringSubmatch(console, -1) {
		ids[m[1]] = m[2]
	}
	ends := map[string]string{}
	for _, m := range regexp.MustCompile(`job (\w+) \(\d+\): (\w+), exit (\d+:\d+)`).FindAllStringSubmatch(console, -1) {
		ends[m[1]] = m[2] + " " + m[3]
	}
	for name, want := range map[string]string{"mlp": "COMPLETED 0:0", "verify": "COMPLETED 0:0", "badflag": "FAILED 2:0", "rankfail": "FAILED 3:0"} {
		if ids[name] == "" {
			t.Fatalf("job %s was not submitted", name)
		}
		if ends[name] != want {
			t.Errorf("job %s (%s): %q, want %q", name, ids[name], ends[name], want)
		}
	}
	output := func(name string) string {
		b, err := os.ReadFile(filepath.Join(keep, "meshrun-"+ids[name]+".out"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	// mlp, submitted with the script's own #SBATCH lines: the batch script's
	// own NATS server, both launchers, 8 ranks each, rank 0's result, and
	// each node's summary.
	mlp, job := output("mlp"), "slurm-"+ids["mlp"]
	for _, want := range []string{
		"NATS server for this job at tls://",
		"launcher: job " + job + ", node 0 of 2, 8 of 16 ranks",
		"launcher: job " + job + ", node 1 of 2, 8 of 16 ranks",
	} {
		if !strings.Contains(mlp, want) {
			t.Errorf("mlp output lacks %q", want)
		}
	}
	var result struct {
		Mesh      string  `json:"mesh"`
		Steps     int     `json:"steps"`
		LossFirst float64 `json:"loss_first"`
		LossLast  float64 `json:"loss_last"`
	}
	if m := regexp.MustCompile(`(?m)0:0\| (\{"mesh".*\})$`).FindStringSubmatch(mlp); m == nil {
		t.Errorf("mlp output lacks rank 0's result")
	} else if err := json.Unmarshal([]byte(m[1]), &result); err != nil {
		t.Errorf("rank 0's result: %v", err)
	} else if result.Mesh != "dp=2,tp=8" || result.Steps != 5 || !(result.LossLast < result.LossFirst) {
		t.Errorf("rank 0's result: %+v, want mesh dp=2,tp=8, 5 steps and a falling loss", result)
	}
	checkSummaries(t, filepath.Join(keep, "runs"), job, 2, 8)
	if _, err := os.Stat(filepath.Join(keep, "runs", ".nats-slurm-"+ids["mlp"])); !os.IsNotExist(err) {
		t.Errorf("the job's NATS credentials folder outlived the job (%v)", err)
	}

	// verify, against the "site" NATS server: every case passed.
	verify := output("verify")
	for node := 0; node < 2; node++ {
		if want := fmt.Sprintf("launcher: job verify-site-nats, node %d of 2, 1 of 2 ranks", node); !strings.Contains(verify, want) {
			t.Errorf("verify output lacks %q", want)
		}
	}
	if m := regexp.MustCompile(`linear\s+tp=2\s+(\d+)\s+(\d+)\s+(\d+)`).FindStringSubmatch(verify); m == nil {
		t.Errorf("verify output lacks its table")
	} else if m[1] != m[2] || m[3] != "0" || m[1] == "0" {
		t.Errorf("verify: %s cases, %s passed, %s failed", m[1], m[2], m[3])
	}
	checkSummaries(t, filepath.Join(keep, "runs"), "verify-site-nats", 2, 1)

	// badflag: both launchers refuse, the job fails with their exit code.
	if bad := output("badflag"); strings.Count(bad, "unknown flag --tokns; did you mean --tokens?") != 2 {
		t.Errorf("badflag output: want the worker's refusal from both launchers:\n%s", bad)
	}

	// rankfail: rank 1 on node 1 exits 3; both launchers name it, and the job
	// ends with its code.
	if fail := output("rankfail"); strings.Count(fail, "launcher run: launch: rank failed: root cause rank 1 (node 1") != 2 {
		t.Errorf("rankfail output: want both launchers to name rank 1 as the root cause:\n%s", fail)
	}
}

// checkSummaries reads runs/node-K/<job>/summary.json of every node.
func checkSummaries(t *testing.T, runs, job string, nodes, perNode int) {
	t.Helper()
	for node := 0; node < nodes; node++ {
		f := filepath.Join(runs, "node-"+strconv.Itoa(node), job, "summary.json")
		b, err := os.ReadFile(f)
		if err != nil {
			t.Error(err)
			continue
		}
		var s struct {
			JobID     string `json:"job_id"`
			Node      int    `json:"node"`
			NNodes    int    `json:"nnodes"`
			WorldSize int    `json:"world_size"`
			ExitCode  int    `json:"exit_code"`
			Reason    string `json:"reason"`
			Ranks     []struct {
				Rank     int `json:"rank"`
				ExitCode int `json:"exit_code"`
			} `json:"ranks"`
		}
		if err := json.Unmarshal(b, &s); err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if s.JobID != job || s.Node != node || s.NNodes != nodes || s.WorldSize != nodes*perNode || s.ExitCode != 0 || s.Reason != "ok" || len(s.Ranks) != perNode {
			t.Errorf("%s: %s", f, b)
			continue
		}
		for i, r := range s.Ranks {
			if r.Rank != node*perNode+i || r.ExitCode != 0 {
				t.Errorf("%s: rank %d exit %d, want rank %d exit 0", f, r.Rank, r.ExitCode, node*perNode+i)
			}
		}
	}
}

// processesUsing lists the processes whose program, folder, command line or
// an open file lies under dir.
func processesUsing(dir string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		refs := false
		for _, l := range []string{"exe", "cwd"} {
			if d, err := os.Readlink(filepath.Join(p, l)); err == nil && strings.HasPrefix(d, dir) {
				refs = true
			}
		}
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		if bytes.Contains(cmdline, []byte(dir)) {
			refs = true
		}
		fds, _ := os.ReadDir(filepath.Join(p, "fd"))
		for _, fd := range fds {
			if d, err := os.Readlink(filepath.Join(p, "fd", fd.Name())); err == nil && strings.HasPrefix(d, dir) {
				refs = true
			}
		}
		if refs {
			out = append(out, filepath.Base(p)+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	return out
}

// TestSlurmScriptsParse: bash reads every batch script and the local test
// script (bash -n); an apostrophe inside "${VAR:?...}" once broke both batch
// scripts before their first line ran.
func TestSlurmScriptsParse(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	files, _ := filepath.Glob("slurm/*.sbatch")
	files = append(files, "slurm/test-local.sh")
	for _, f := range files {
		if out, err := exec.Command("bash", "-n", f).CombinedOutput(); err != nil {
			t.Errorf("bash -n %s: %v\n%s", f, err, out)
		}
	}
}

// TestSlurmScriptsAlike: the CUDA batch script is the CPU one but for its GPU
// lines: the same commands, line for line, apart from the default workload,
// the srun line (the CPU step passes --cpus-per-task on) and the ranks per node
// and device; their #SBATCH lines differ only in the resources asked for.
func TestSlurmScriptsAlike(t *testing.T) {
	read := func(f string) (code, directives []string) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			switch {
			case strings.HasPrefix(l, "#SBATCH "):
				directives = append(directives, l)
			case strings.TrimSpace(l) == "" || strings.HasPrefix(strings.TrimSpace(l), "#"):
			default:
				code = append(code, l)
			}
		}
		return code, directives
	}
	cpu, cpuDirs := read("slurm/meshrun-cpu.sbatch")
	cuda, cudaDirs := read("slurm/meshrun-cuda.sbatch")
	if len(cpu) != len(cuda) {
		t.Fatalf("the CPU script has %d lines of commands, the CUDA one %d", len(cpu), len(cuda))
	}
	allowed := regexp.MustCompile(`^\s*(set -- mlp |srun |--nproc-per-node )`)
	for i := range cpu {
		if cpu[i] != cuda[i] && !(allowed.MatchString(cpu[i]) && allowed.MatchString(cuda[i])) {
			t.Errorf("line %d of commands differs:\n  cpu:  %s\n  cuda: %s", i+1, cpu[i], cuda[i])
		}
	}
	resources := regexp.MustCompile(`^#SBATCH --(job-name|cpus-per-task|mem|gres|exclusive)\b`)
	strip := func(ds []string) (out []string) {
		for _, d := range ds {
			if !resources.MatchString(d) {
				out = append(out, d)
			}
		}
		return out
	}
	if a, b := strings.Join(strip(cpuDirs), "\n"), strings.Join(strip(cudaDirs), "\n"); a != b {
		t.Errorf("#SBATCH lines differ beyond the resources:\ncpu:\n%s\ncuda:\n%s", a, b)
	}
}
