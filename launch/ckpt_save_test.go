package launch

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/ckpt/ckpttest"
	"github.com/meshrun/meshrun/logview"
	"golang.org/x/sys/unix"
)

// savedRanks are the ranks a "checkpoint step N not saved: rank 0, 2, 3: ..."
// error names first.
func savedRanks(t *testing.T, msg string) []int {
	t.Helper()
	m := regexp.MustCompile(`not saved: rank ([0-9, ]+):`).FindStringSubmatch(msg)
	if m == nil {
		t.Fatalf("no failed ranks in %q", msg)
	}
	var rs []int
	for _, f := range strings.Split(m[1], ", ") {
		r, _ := strconv.Atoi(f)
		rs = append(rs, r)
	}
	return rs
}

// noTemp fails the test for a temporary folder left under root.
func noTemp(t *testing.T, root string) {
	t.Helper()
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			t.Errorf("%s left under %s", e.Name(), root)
		}
	}
}

// TestCheckpointDiskFullBlame (root: a tmpfs with 10 inodes): the save of
// step 2 takes 8 of them (the file system's root, the folder of checkpoints,
// the checkpoint's folder, 4 rank files and the index; 9 beyond what the
// empty file system uses on a kernel that counts otherwise); the save of step 4
// has room for its folder and one rank file, so three of the four ranks get
// the kernel's ENOSPC creating theirs, the free-space check (bytes) having
// passed. The job fails naming those three: summary.json's root cause is
// the first of them (the ranks that succeeded blame it, and every rank's
// error names all three), `logs why` says so, no temporary folder is left,
// and step 2 verifies and resumes to the uninterrupted run's loss.
func TestCheckpointDiskFullBlame(t *testing.T) {
	mnt := ckpttest.Tmpfs(t, "size=3m,nr_inodes=10")
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Files - st.Ffree; used != 1 { // a kernel that counts its root otherwise
		if out, err := exec.Command("mount", "-o", "remount,nr_inodes="+strconv.FormatUint(used+9, 10), mnt).CombinedOutput(); err != nil {
			t.Fatalf("remount: %v %s", err, out)
		}
	}
	root := filepath.Join(mnt, "ck")
	work := []string{"mlp", "--tokens", "16", "--hidden", "32", "--ffn", "128", "--steps", "6"}
	code, dir, _, stderr := launch(t, append([]string{"-n", "4"}, append(work, "--save", root, "--save-every", "2")...)...)
	if code == 0 {
		t.Fatalf("the job survived a full disk:\n%s", stderr)
	}
	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	rc := sum.RootCause
	if rc == nil {
		t.Fatalf("no root cause: %+v\n%s", sum, stderr)
	}
	failed := savedRanks(t, rc.Error)
	t.Logf("root cause: rank %d (%s): %s", rc.Rank, rc.Evidence, rc.Error)
	if len(failed) != 3 || rc.Rank != failed[0] || !strings.Contains(rc.Error, "checkpoint step 4 not saved") ||
		strings.Count(rc.Error, "no space left on device creating") != 1 || !strings.Contains(rc.Error, "last good checkpoint: "+ckpt.StepDir(root, 2)) {
		t.Errorf("root cause rank %d, error %q: want the first of three ranks failing with ENOSPC", rc.Rank, rc.Error)
	}
	for r := range 4 {
		rec, ok := logview.ReadErrorFile(filepath.Join(dir, RankDir(r)))
		if !ok || !slices.Equal(rec.Culprits, failed) || rec.Culprit == nil || *rec.Culprit != failed[0] {
			t.Errorf("rank %d's error record: %+v, want culprits %v", r, rec, failed)
		}
	}
	var why bytes.Buffer
	if err := logview.Why(dir, &why); err != nil {
		t.Fatal(err)
	}
	t.Logf("logs why:\n%s", why.String())
	if !strings.Contains(why.String(), "root cause: rank "+strconv.Itoa(failed[0])+" ") || !strings.Contains(why.String(), "not saved: "+ckpt.FormatRanks(failed)+": no space left on device") {
		t.Errorf("logs why does not name ranks %v:\n%s", failed, why.String())
	}
	noTemp(t, root)
	c, err := ckpt.Open(ckpt.OS, root)
	if err == nil {
		err = c.Verify()
	}
	if err != nil || c.Index.Step != 2 {
		t.Fatalf("step 2's checkpoint: %v", err)
	}
	full := workerReport(t, append(work[1:], "--mesh", "tp=4")...)
	resumed := workerReport(t, append(work[1:], "--mesh", "tp=4", "--resume", root)...)
	if resumed["first_step"] != 3.0 || resumed["loss_last"] != full["loss_last"] {
		t.Errorf("resumed: first step %v, loss %v; uninterrupted %v", resumed["first_step"], resumed["loss_last"], full["loss_last"])
	}
}

// TestCheckpointSpaceCheckBlame (root: a 3 MiB tmpfs): a checkpoint that
// cannot fit is refused before anything is written, naming the ranks that
// write (on dp=2,tp=2 ranks 0 and 1; 2 and 3 write nothing): the root cause
// is rank 0, with the space needed and free, and `logs why` says so.
func TestCheckpointSpaceCheckBlame(t *testing.T) {
	mnt := ckpttest.Tmpfs(t, "size=3m")
	root := filepath.Join(mnt, "ck")
	// 2 x 512 x 1024 float32: 4 MiB.
	code, dir, _, stderr := launch(t, "-n", "4", "mlp", "--mesh", "dp=2,tp=2", "--tokens", "16", "--hidden", "512", "--ffn", "1024", "--steps", "1", "--save", root)
	if code == 0 {
		t.Fatalf("the job saved 4 MiB into 3:\n%s", stderr)
	}
	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	rc := sum.RootCause
	want := "checkpoint step 1 not saved: rank 0, 1: not enough free space on the file system of " + root + ": the save needs "
	if rc == nil || rc.Rank != 0 || !strings.Contains(rc.Error, want) || !strings.Contains(rc.Error, "nothing was written") {
		t.Fatalf("root cause %+v, want rank 0 and %q\n%s", rc, want, stderr)
	}
	var why bytes.Buffer
	if err := logview.Why(dir, &why); err != nil || !strings.Contains(why.String(), "root cause: rank 0 ") || !strings.Contains(why.String(), want) {
		t.Errorf("logs why: %v\n%s", err, why.String())
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Errorf("written: %v", ents)
	}
}

// TestCheckpointDeadRankCleanup: rank 1 SIGKILLed in the middle of a save:
// the launcher names it, rank 0 (which commits nothing once the save's
// collective failed) removes the temporary folder, and every checkpoint
// left verifies.
func TestCheckpointDeadRankCleanup(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 32 MiB checkpoints")
	}
	root := filepath.Join(t.TempDir(), "ckpt")
	logDir := t.TempDir()
	var out, errb bytes.Buffer
	res := make(chan int, 1)
	// 2 x 512 x 8192 float32 parameters: 16 MiB a rank a save.
	args := []string{"mlp", "--tokens", "8", "--hidden", "512", "--ffn", "8192", "--steps", "200", "--save", root, "--save-every", "1", "--keep", "2"}
	go func() {
		res <- Main(context.Background(), append([]string{"run", "--worker", worker(), "--log-dir", logDir, "--job-id", "dead-save", "--grace", "2s", "-n", "2"}, args...), &out, &errb)
	}()
	dir := filepath.Join(logDir, "dead-save")
	rec := waitJobRecord(t, dir)
	var killed string
	waitFor(t, 60*time.Second, "a save in progress after a complete one", func() bool {
		if steps, _ := ckpt.Steps(ckpt.OS, root); len(steps) == 0 {
			return false
		}
		ents, _ := os.ReadDir(root)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".tmp-step-") {
				if err := syscall.Kill(rec.Ranks[1].PID, syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				killed = e.Name()
				return true
			}
		}
		return false
	})
	select {
	case code := <-res:
		if code == 0 {
			t.Fatalf("the job survived a SIGKILLed rank: %s", errb.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the launcher did not end")
	}
	sum := readJSON[Summary](t, filepath.Join(dir, SummaryFile))
	if rc := sum.RootCause; rc == nil || rc.Rank != 1 || rc.Signal != "SIGKILL" {
		t.Errorf("root cause %+v, want rank 1 SIGKILLed", rc)
	}
	_, statErr := os.Stat(filepath.Join(root, strings.TrimPrefix(killed, ".tmp-")))
	r0, _ := os.ReadFile(filepath.Join(dir, RankDir(0), "stderr.log"))
	r0lines := strings.Split(strings.TrimSpace(string(r0)), "\n")
	t.Logf("killed during %s (committed before the kill: %v); rank 0: %s", killed, statErr == nil, r0lines[len(r0lines)-1])
	noTemp(t, root)
	steps, err := ckpt.Steps(ckpt.OS, root)
	if err != nil || len(steps) == 0 {
		t.Fatalf("checkpoints %v: %v\nrank 0:\n%s", steps, err, r0)
	}
	for _, s := range steps {
		c, err := ckpt.Open(ckpt.OS, ckpt.StepDir(root, s))
		if err == nil {
			err = c.Verify()
		}
		if err != nil {
			t.Errorf("checkpoint of step %d: %v", s, err)
		}
	}
}

// workerReport runs the worker alone (in-process ranks) and returns its
// JSON report.
func workerReport(t *testing.T, args ...string) map[string]any {
	t.Helper()
	b, err := exec.Command(worker(), append([]string{"mlp"}, args...)...).Output()
	if err != nil {
		t.Fatalf("worker mlp %v: %v", args, err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &m); err != nil {
		t.Fatalf("worker mlp %v: report %q: %v", args, lines[len(lines)-1], err)
	}
	return m
}
