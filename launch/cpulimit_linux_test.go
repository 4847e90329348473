package launch

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/launch/cpulimit"
)

// TestCPUsPerRank runs two ranks that spin for a second each under
// --cpus-per-rank 0.25: each is in a cgroup of its own from its first
// instruction (what it starts too), pinned to the launcher's first CPU
// (both fit on it), gets about a quarter of a core (its children's CPU
// time, read by the rank itself), the job's record says so, and the cgroups
// are gone when the job ends.
func TestCPUsPerRank(t *testing.T) {
	if p := cpulimit.Problem(0.25); p != "" {
		t.Skip(p)
	}
	// The rank prints its cgroups, spins in a child for a second of wall
	// time, and prints the child's CPU ticks (its stat's cutime + cstime).
	script := `grep -E '^[0-9]+:[^:]*cpu[,:]|^0::' /proc/self/cgroup; grep Cpus_allowed_list /proc/self/status; timeout 1 sh -c 'while :; do :; done'; ` +
		`set -- $(cut -d' ' -f16,17 /proc/$$/stat); echo "ticks $(($1 + $2)) of $(getconf CLK_TCK)"`
	code, dir, _, stderr := launch(t, "-n", "2", "--cpus-per-rank", "0.25", "--", "/bin/sh", "-c", script)
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	rec := readJSON[JobRecord](t, filepath.Join(dir, JobFile))
	if rec.CPUsPerRank != 0.25 || len(rec.Ranks) != 2 || rec.Ranks[0].GOMAXPROCS != 1 {
		t.Errorf("job.json: cpus_per_rank %v, ranks %+v", rec.CPUsPerRank, rec.Ranks)
	}
	for r := range 2 {
		b, err := os.ReadFile(filepath.Join(dir, RankDir(r), "stdout.log"))
		if err != nil {
			t.Fatal(err)
		}
		out := string(b)
		want := "/meshrun-" + rec.JobID + "/rank-" + strconv.Itoa(r)
		if !strings.Contains(out, want) {
			t.Errorf("rank %d is not in its cgroup %s from its start:\n%s", r, want, out)
		}
		own, err := cpulimit.ThreadCPUs()
		if err != nil {
			t.Fatal(err)
		}
		if pin := fmt.Sprintf("Cpus_allowed_list:\t%d\n", own[0]); !strings.Contains(out, pin) {
			t.Errorf("rank %d is not pinned to the first CPU (%q):\n%s", r, pin, out)
		}
		var ticks, hz int
		if i := strings.Index(out, "ticks "); i < 0 {
			t.Fatalf("rank %d printed no ticks:\n%s", r, out)
		} else if _, err := fmt.Sscanf(out[i:], "ticks %d of %d", &ticks, &hz); err != nil {
			t.Fatalf("rank %d: %v in %q", r, err, out[i:])
		}
		// At most a quarter of a core for a second, with room for the
		// periods around it (less where the machine is busy); uncapped
		// the spin takes the whole second.
		if cpu := float64(ticks) / float64(hz); cpu <= 0 || cpu > 0.45 {
			t.Errorf("rank %d: its spin took %.2f s of CPU in a second of wall time, want at most about 0.25", r, cpu)
		}
	}
	if left, _ := filepath.Glob(cpulimit.JobDir(rec.JobID)); len(left) > 0 {
		t.Errorf("the job's cgroup outlived it: %v", left)
	}
}

// TestCPUsPerRankRefused: a cap out of range (0 is none), or more cores than the
// machine's for the ranks asked, is refused before anything starts.
func TestCPUsPerRankRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cpus-per-rank", "0.001", "hello"}, "want a number of cores from 0.01 up"},
		{[]string{"--cpus-per-rank", "-1", "hello"}, "want a number of cores from 0.01 up"},
		{[]string{"--cpus-per-rank", "NaN", "hello"}, "want a number of cores from 0.01 up"},
		{[]string{"-n", strconv.Itoa(2 * cores()), "--cpus-per-rank", "1", "hello"}, "--oversubscribe runs it anyway"},
		{[]string{"--cpus-per-rank", "lots", "hello"}, `invalid value "lots"`},
	} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), append([]string{"run", "--dry-run"}, tc.args...), &out, &errb)
		if code != ExitUsage || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want exit %d saying %q", tc.args, code, errb.String(), ExitUsage, tc.want)
		}
	}
}
