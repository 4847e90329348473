package job

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/ckpt/ckpttest"
	"github.com/meshrun/meshrun/runlog"
)

// withSaveFS sets the saves' file system hook for one test.
func withSaveFS(t *testing.T, f func(rank, step int, fsys ckpt.FS) ckpt.FS) {
	t.Helper()
	saveFS = f
	t.Cleanup(func() { saveFS = nil })
}

// runRecorded runs a workload in process as rank 0 of a launched job would
// record its failure: error.json in a rank folder, whose record it returns
// (nil when the run wrote none).
func runRecorded(t *testing.T, args ...string) (code int, stdout, stderr string, rec *runlog.ErrorRecord) {
	t.Helper()
	dir := t.TempDir()
	env := map[string]string{runlog.EnvRankDir: dir, "RANK": "0"}
	getenv := func(k string) string { return env[k] }
	r, err := runlog.Open(runlog.Options{Getenv: getenv, NoSignal: true})
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code = Main(context.Background(), Env{Args: args, Getenv: func(string) string { return "" }, Stdout: &out, Stderr: &errb, Run: r})
	r.Close()
	if b, err := os.ReadFile(filepath.Join(dir, runlog.ErrorFile)); err == nil {
		rec = &runlog.ErrorRecord{}
		if err := json.Unmarshal(b, rec); err != nil {
			t.Fatalf("%s: %v", runlog.ErrorFile, err)
		}
	}
	return code, out.String(), errb.String(), rec
}

// reportOf is the JSON report a workload printed last.
func reportOf(t *testing.T, out string) MLPReport {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var r MLPReport
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("report %q: %v", lines[len(lines)-1], err)
	}
	return r
}

// checkSaveFailed checks what a failed save leaves: no temporary folder, the
// checkpoints want (steps) whole, the newest verifying.
func checkSaveFailed(t *testing.T, root string, want []int) {
	t.Helper()
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			t.Errorf("%s left", e.Name())
		}
	}
	steps, err := ckpt.Steps(ckpt.OS, root)
	if err != nil || !slices.Equal(steps, want) {
		t.Fatalf("checkpoints %v (%v), want %v", steps, err, want)
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

// checkRecord checks a rank's error record: it blames the first failed rank
// and names every failed one, never a rank that succeeded.
func checkRecord(t *testing.T, rec *runlog.ErrorRecord, ranks []int, text string) {
	t.Helper()
	if rec == nil {
		t.Fatal("no error.json")
	}
	if rec.Culprit == nil || *rec.Culprit != ranks[0] || !slices.Equal(rec.Culprits, ranks) || !strings.Contains(rec.Error, text) {
		t.Errorf("error record: culprit %v, culprits %v, want %d and %v; error %q, want it to hold %q", rec.Culprit, rec.Culprits, ranks[0], ranks, rec.Error, text)
	}
}

// TestSaveFailsOnSomeRanks (any user, faults injected): a save whose writes
// fail on ranks 0, 2 (EIO) and 3 (ENOSPC) while rank 1's succeeds fails on
// every rank with one error naming the three, each with its reason and file;
// the error record blames rank 0 and names 0, 2 and 3, not rank 1; the
// temporary folder is removed and the previous checkpoint stays whole and
// resumable to the uninterrupted run's loss. With --save-errors continue the
// run trains on, warns naming the ranks and the last good checkpoint, and
// the next save succeeds.
func TestSaveFailsOnSomeRanks(t *testing.T) {
	base := []string{"mlp", "--mesh", "tp=4", "--tokens", "16", "--hidden", "16", "--ffn", "64", "--steps", "8"}
	full := mlpRun(t, base[1:]...)
	failing := map[int]error{0: syscall.ENOSPC, 2: syscall.EIO, 3: syscall.ENOSPC}
	faults := func(failStep int) func(rank, step int, fsys ckpt.FS) ckpt.FS {
		return func(rank, step int, fsys ckpt.FS) ckpt.FS {
			if step != failStep || failing[rank] == nil {
				return fsys
			}
			return &ckpttest.FS{FS: fsys, OnWrite: func(name string, off int64) error {
				if off > 0 { // after the header, in the data
					return failing[rank]
				}
				return nil
			}}
		}
	}
	wantErr := func(root string) string {
		tmp := ckpt.TempDir(root, 4)
		return "checkpoint step 4 not saved: rank 0, 3: no space left on device writing " + filepath.Join(tmp, "rank-00000.safetensors") + ", rank-00003.safetensors" +
			"; rank 2: input/output error writing " + filepath.Join(tmp, "rank-00002.safetensors") +
			"; its partial folder " + tmp + " was removed; last good checkpoint: " + ckpt.StepDir(root, 2)
	}

	t.Run("stop", func(t *testing.T) {
		root := t.TempDir()
		withSaveFS(t, faults(4))
		code, out, errs, rec := runRecorded(t, append(base, "--save", root, "--save-every", "2")...)
		if code != 1 || !strings.Contains(errs, wantErr(root)) || strings.Contains(out, "step 5/") {
			t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and %q, no step after 4\nstdout:\n%s", code, errs, wantErr(root), out)
		}
		checkRecord(t, rec, []int{0, 2, 3}, wantErr(root))
		checkSaveFailed(t, root, []int{2})
		r := mlpRun(t, append(base[1:], "--resume", root)...)
		if r.FirstStep != 3 || r.LossLast != full.LossLast {
			t.Errorf("resumed from step 2: first step %d, loss %v; uninterrupted %v", r.FirstStep, r.LossLast, full.LossLast)
		}
	})
	t.Run("continue", func(t *testing.T) {
		root := t.TempDir()
		withSaveFS(t, faults(4))
		code, out, errs, rec := runRecorded(t, append(base, "--save", root, "--save-every", "2", "--save-errors", "continue")...)
		if code != 0 || rec != nil {
			t.Fatalf("exit %d, record %+v: %s", code, rec, errs)
		}
		if !strings.Contains(errs, "mlp: warning: "+wantErr(root)+"; training goes on (--save-errors continue), the next save tries again") {
			t.Errorf("stderr:\n%s\nwant the warning %q", errs, wantErr(root))
		}
		r := reportOf(t, out)
		if r.SaveFailures != 1 || r.LossLast != full.LossLast {
			t.Errorf("save failures %d, loss %v (uninterrupted %v)", r.SaveFailures, r.LossLast, full.LossLast)
		}
		checkSaveFailed(t, root, []int{2, 6, 8})
	})
	t.Run("bad policy", func(t *testing.T) {
		if code, _, errs := run(t, append(base, "--save", t.TempDir(), "--save-errors", "ignore")...); code != ExitUsage || !strings.Contains(errs, `--save-errors "ignore": want stop or continue`) {
			t.Errorf("exit %d: %s", code, errs)
		}
	})
}

// TestSaveSpaceCheckLies (any user, free space faked): the free-space check
// refuses a save that cannot fit before any rank creates a file, naming the
// writing ranks of the file system short of space (on dp=2,tp=2 ranks 0 and
// 1 write, 2 and 3 write nothing), what they need and what is free.
func TestSaveSpaceCheckLies(t *testing.T) {
	root := t.TempDir()
	var created atomic.Int32
	withSaveFS(t, func(rank, step int, fsys ckpt.FS) ckpt.FS {
		return &ckpttest.FS{FS: fsys,
			OnCreate: func(string) error { created.Add(1); return nil },
			OnSpace:  func(_ string, sp ckpt.Space) ckpt.Space { sp.Free = 1 << 20; return sp }}
	})
	code, out, errs, rec := runRecorded(t, "mlp", "--mesh", "dp=2,tp=2", "--tokens", "16", "--hidden", "16", "--ffn", "64", "--steps", "2", "--save", root)
	want := "checkpoint step 2 not saved: rank 0, 1: not enough free space on the file system of " + root + ": the save needs "
	if code != 1 || !strings.Contains(errs, want) || !strings.Contains(errs, "is free; nothing was written; no checkpoint under "+root+" yet") {
		t.Fatalf("exit %d, stderr:\n%s\nwant %q\nstdout %s", code, errs, want, out)
	}
	if n := created.Load(); n != 0 {
		t.Errorf("%d files created", n)
	}
	checkRecord(t, rec, []int{0, 1}, want)
	checkSaveFailed(t, root, nil)
}

// TestSaveDiskFull (root: a 3 MiB tmpfs): the kernel's own ENOSPC. The save
// of step 2 fits; before the save of step 4 another writer fills the disk
// after the free-space check (the check is told the space it took is still
// free), and rank 1 writes first: its file fits, then ranks 0, 2 and 3 share
// what is left, which holds none of their files. The error, on every rank,
// names ranks 0, 2 and 3 and not rank 1; the error record blames rank 0 and
// names the three; the partial folder is removed (the disk is not left
// full), step 2 resumes to the uninterrupted run's loss. With --save-errors
// continue, the other writer's file is gone by the save of step 6, which
// succeeds, as does step 8's. A save that cannot fit at all is refused by
// the free-space check, before anything is written.
func TestSaveDiskFull(t *testing.T) {
	mnt := ckpttest.Tmpfs(t, "size=3m")
	// 2 x 64 x 1024 float32 parameters: 128 KiB a rank, 512 KiB a checkpoint.
	base := []string{"mlp", "--mesh", "tp=4", "--tokens", "16", "--hidden", "64", "--ffn", "1024", "--steps", "8"}
	full := mlpRun(t, base[1:]...)
	root, ballast := filepath.Join(mnt, "ck"), filepath.Join(mnt, "ballast")
	var filler atomic.Int64 // the bytes of the ballast (the check counts them free)
	hook := func(freeAt int) func(rank, step int, fsys ckpt.FS) ckpt.FS {
		rank1 := make(chan struct{})
		var once sync.Once
		return func(rank, step int, fsys ckpt.FS) ckpt.FS {
			if step == freeAt && rank == 0 {
				os.Remove(ballast)
				filler.Store(0)
			}
			if step != 4 {
				return fsys
			}
			if rank == 0 { // before the save's barrier: every rank measures after it
				st, err := os.Stat(filepath.Join(ckpt.StepDir(root, 2), "rank-00001.safetensors"))
				if err != nil {
					t.Errorf("step 2: %v", err)
					return fsys
				}
				sp, _ := ckpt.OS.Space(mnt)
				// Leave one and a half rank files free.
				n := (sp.Free - st.Size()*3/2) &^ 4095
				if err := os.WriteFile(ballast, make([]byte, n), 0o644); err != nil {
					t.Errorf("ballast: %v", err)
				}
				filler.Store(n)
			}
			return &ckpttest.FS{FS: fsys,
				OnSpace: func(_ string, sp ckpt.Space) ckpt.Space { sp.Free += filler.Load(); return sp },
				OnCreate: func(name string) error {
					if rank != 1 && strings.HasSuffix(name, ".safetensors") {
						<-rank1
					}
					return nil
				},
				OnClose: func(name string) {
					if rank == 1 {
						once.Do(func() { close(rank1) })
					}
				}}
		}
	}
	want := func() string {
		tmp := ckpt.TempDir(root, 4)
		return "checkpoint step 4 not saved: rank 0, 2, 3: no space left on device writing " + filepath.Join(tmp, "rank-00000.safetensors") +
			", rank-00002.safetensors, rank-00003.safetensors; its partial folder " + tmp + " was removed; last good checkpoint: " + ckpt.StepDir(root, 2)
	}

	t.Run("stop", func(t *testing.T) {
		withSaveFS(t, hook(-1))
		t.Cleanup(func() { os.RemoveAll(root); os.Remove(ballast) })
		code, out, errs, rec := runRecorded(t, append(base, "--save", root, "--save-every", "2")...)
		if code != 1 || !strings.Contains(errs, want()) || strings.Contains(out, "step 5/") {
			t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and %q\nstdout:\n%s", code, errs, want(), out)
		}
		t.Logf("stderr:\n%s", errs)
		checkRecord(t, rec, []int{0, 2, 3}, want())
		checkSaveFailed(t, root, []int{2})
		os.Remove(ballast)
		r := mlpRun(t, append(base[1:], "--resume", root)...)
		if r.FirstStep != 3 || r.LossLast != full.LossLast {
			t.Errorf("resumed from step 2: first step %d, loss %v; uninterrupted %v", r.FirstStep, r.LossLast, full.LossLast)
		}
	})
	t.Run("continue", func(t *testing.T) {
		withSaveFS(t, hook(6))
		t.Cleanup(func() { os.RemoveAll(root); os.Remove(ballast) })
		code, out, errs, rec := runRecorded(t, append(base, "--save", root, "--save-every", "2", "--save-errors", "continue")...)
		if code != 0 || rec != nil || !strings.Contains(errs, "mlp: warning: "+want()+"; training goes on") {
			t.Fatalf("exit %d, record %+v, stderr:\n%s\nwant the warning %q", code, rec, errs, want())
		}
		if r := reportOf(t, out); r.SaveFailures != 1 || r.LossLast != full.LossLast {
			t.Errorf("save failures %d, loss %v (uninterrupted %v)", r.SaveFailures, r.LossLast, full.LossLast)
		}
		checkSaveFailed(t, root, []int{2, 6, 8})
	})
	t.Run("space check", func(t *testing.T) {
		// 2 x 256 x 1024 float32: 2 MiB, and the margin: more than 3 MiB.
		var created atomic.Int32
		withSaveFS(t, func(rank, step int, fsys ckpt.FS) ckpt.FS {
			return &ckpttest.FS{FS: fsys, OnCreate: func(string) error { created.Add(1); return nil }}
		})
		t.Cleanup(func() { os.RemoveAll(root) })
		code, _, errs, rec := runRecorded(t, "mlp", "--mesh", "tp=4", "--tokens", "16", "--hidden", "256", "--ffn", "1024", "--steps", "2", "--save", root)
		want := "checkpoint step 2 not saved: rank 0, 1, 2, 3: not enough free space on the file system of " + root + ": the save needs "
		if code != 1 || !strings.Contains(errs, want) || !strings.Contains(errs, "nothing was written") || created.Load() != 0 {
			t.Fatalf("exit %d, %d files created, stderr:\n%s\nwant %q", code, created.Load(), errs, want)
		}
		t.Logf("stderr:\n%s", errs)
		checkRecord(t, rec, []int{0, 1, 2, 3}, want)
		checkSaveFailed(t, root, nil)
	})
}
