package ckpt_test

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/ckpt/ckpttest"
	"github.com/meshrun/meshrun/protocol"
	"github.com/meshrun/meshrun/tensor"
)

// TestSaveErrorNamesEveryRank: a save that failed on ranks 0, 2 and 3 (each
// failure taken apart from the file system's error, and sent between ranks
// as JSON) says all three, together, with the files, what became of the
// temporary folder and the last good checkpoint; it blames rank 0 (a rank
// that failed, never rank 1, which did not) and all three as culprits, and
// is ENOSPC to errors.Is.
func TestSaveErrorNamesEveryRank(t *testing.T) {
	root := "/ck"
	tmp := ckpt.TempDir(root, 40)
	var fails []ckpt.RankFailure
	for _, r := range []int{3, 0, 2} { // in any order
		err := &fs.PathError{Op: "write", Path: filepath.Join(tmp, []string{"rank-00000.safetensors", "", "rank-00002.safetensors", "rank-00003.safetensors"}[r]), Err: syscall.ENOSPC}
		b, _ := json.Marshal(ckpt.FailureOf(r, err))
		var f ckpt.RankFailure
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatal(err)
		}
		fails = append(fails, f)
	}
	se := &ckpt.SaveError{Step: 40, Root: root, Failures: fails, Removed: true, LastGood: ckpt.StepDir(root, 30)}
	want := "checkpoint step 40 not saved: rank 0, 2, 3: no space left on device writing /ck/.tmp-step-00000040/rank-00000.safetensors, rank-00002.safetensors, rank-00003.safetensors" +
		"; its partial folder /ck/.tmp-step-00000040 was removed; last good checkpoint: /ck/step-00000030"
	if se.Error() != want {
		t.Errorf("error:\n%s\nwant\n%s", se, want)
	}
	var err error = se
	if c := protocol.Culprit(err); c != 0 {
		t.Errorf("culprit %d, want 0", c)
	}
	if cs := protocol.Culprits(err); !slices.Equal(cs, []int{0, 2, 3}) {
		t.Errorf("culprits %v", cs)
	}
	if !errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EIO) {
		t.Errorf("errors.Is: ENOSPC %v, EIO %v", errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EIO))
	}

	// Different reasons are said apart; one that is no file system error
	// whole; a folder that could not be removed, and no checkpoint yet.
	se = &ckpt.SaveError{Step: 7, Root: root, RemoveErr: "permission denied", Failures: []ckpt.RankFailure{
		ckpt.FailureOf(2, &fs.PathError{Op: "sync", Path: filepath.Join(ckpt.TempDir(root, 7), "rank-00002.safetensors"), Err: syscall.EIO}),
		ckpt.FailureOf(1, errors.New("cuda: device lost")),
	}}
	want = "checkpoint step 7 not saved: rank 1: cuda: device lost; rank 2: input/output error syncing /ck/.tmp-step-00000007/rank-00002.safetensors" +
		"; its partial folder /ck/.tmp-step-00000007 could not be removed: permission denied; no checkpoint under /ck yet"
	if se.Error() != want {
		t.Errorf("error:\n%s\nwant\n%s", se, want)
	}
}

// TestCheckSpace: the ranks writing to one file system need the sum of
// their files and a margin against the least free space they saw; only the
// ranks of a file system that cannot take it fail (ranks that write nothing,
// and those of another file system, do not), each with what is needed and
// what is free, as ENOSPC.
func TestCheckSpace(t *testing.T) {
	const mib = 1 << 20
	small, big := ckpt.Space{Free: 3 * mib, FS: "host:a"}, ckpt.Space{Free: 100 * mib, FS: "host:b"}
	plans := []ckpt.SpacePlan{
		{Rank: 0, Need: mib, Space: small},
		{Rank: 1, Need: mib, Space: big},
		{Rank: 2, Need: mib, Space: ckpt.Space{Free: 2*mib + mib/2, FS: "host:a"}}, // measured later, less free
		{Rank: 3, Need: 0},
	}
	fails := ckpt.CheckSpace("/ck", plans)
	var ranks []int
	for _, f := range fails {
		ranks = append(ranks, f.Rank)
	}
	if !slices.Equal(ranks, []int{0, 2}) {
		t.Fatalf("failed ranks %v, want [0 2]: %+v", ranks, fails)
	}
	want := "not enough free space on the file system of /ck: the save needs 3.02 MiB there (2 files of 1.00 MiB, 2.00 MiB, and a margin of 1.02 MiB), 2.50 MiB is free"
	if fails[0].Reason != want || fails[0].Errno != int(syscall.ENOSPC) {
		t.Errorf("reason %q (errno %d), want %q", fails[0].Reason, fails[0].Errno, want)
	}
	se := &ckpt.SaveError{Step: 4, Root: "/ck", Failures: fails, Checked: true}
	if s := se.Error(); !strings.HasPrefix(s, "checkpoint step 4 not saved: rank 0, 2: not enough free space") || !strings.Contains(s, "; nothing was written;") {
		t.Errorf("error %q", s)
	}
	// Enough space everywhere: no failure. Each rank alone would fit the
	// small file system, together they do not: the sum counts.
	if f := ckpt.CheckSpace("/ck", []ckpt.SpacePlan{{Rank: 0, Need: mib, Space: big}, {Rank: 1, Need: 50 * mib, Space: big}}); f != nil {
		t.Errorf("fits, but %+v", f)
	}
	if f := ckpt.CheckSpace("/ck", []ckpt.SpacePlan{{Rank: 0, Need: mib / 2, Space: small}, {Rank: 1, Need: mib / 2, Space: small}, {Rank: 2, Need: mib, Space: small}}); len(f) != 3 {
		t.Errorf("1 + 0.5 + 0.5 MiB and a margin in 3 MiB: %+v", f)
	}
	// OS: the free space of a real folder, the same file system for two
	// folders of it.
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	a, err := ckpt.OS.Space(dir)
	if err != nil || a.Free <= 0 || a.FS == "" {
		t.Fatalf("Space(%s) = %+v, %v", dir, a, err)
	}
	if b, err := ckpt.OS.Space(filepath.Join(dir, "sub")); err != nil || b.FS != a.FS {
		t.Errorf("sub folder: %+v, %v; parent %+v", b, err, a)
	}
	if _, err := ckpt.OS.Space(filepath.Join(dir, "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing folder: %v", err)
	}
}

// TestFileSize: what the free-space check counts is what WriteFile writes.
func TestFileSize(t *testing.T) {
	entries := []ckpt.Entry{{Name: "w", DType: tensor.Float32, Shape: []int{3, 5}}, {Name: "b", DType: tensor.BFloat16, Shape: []int{7}}}
	data := [][]byte{make([]byte, 60), make([]byte, 14)}
	meta := map[string]string{"format": "meshrun"}
	n, err := ckpt.FileSize(entries, meta)
	if err != nil {
		t.Fatal(err)
	}
	info, err := ckpt.WriteFile(ckpt.OS, filepath.Join(t.TempDir(), "f.safetensors"), entries, data, meta)
	if err != nil || info.Size != n {
		t.Errorf("FileSize %d, WriteFile wrote %+v, %v", n, info, err)
	}
}

// TestCommitFailureRemovesTemp: a commit that fails before its rename (the
// index cannot be written: the disk is full) removes the temporary folder,
// which holds space the next save needs; the previous checkpoint stays whole.
func TestCommitFailureRemovesTemp(t *testing.T) {
	root := t.TempDir()
	write(t, root, 3, 4, 8, 2)
	tmp := ckpt.TempDir(root, 5)
	os.MkdirAll(tmp, 0o755)
	os.WriteFile(filepath.Join(tmp, "rank-00000.safetensors"), []byte("partial"), 0o644)
	fsys := &ckpttest.FS{FS: ckpt.OS, OnWrite: func(name string, _ int64) error {
		if filepath.Base(name) == ckpt.IndexFile {
			return syscall.ENOSPC
		}
		return nil
	}}
	err := ckpt.Commit(fsys, root, &ckpt.Index{Step: 5}, 2)
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "writing the index") {
		t.Fatalf("commit: %v", err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("temporary folder left: %v", err)
	}
	c, err := ckpt.Open(ckpt.OS, root)
	if err == nil {
		err = c.Verify()
	}
	if err != nil || c.Index.Step != 3 {
		t.Errorf("previous checkpoint: %v", err)
	}
	// Left by a save that never finished: RemoveTemps removes it, and only it.
	os.MkdirAll(tmp, 0o755)
	if err := ckpt.RemoveTemps(ckpt.OS, root); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 1 || ents[0].Name() != "step-00000003" {
		t.Errorf("after RemoveTemps: %v", ents)
	}
	if got := ckpt.Newest(ckpt.OS, root); got != ckpt.StepDir(root, 3) {
		t.Errorf("Newest %q", got)
	}
	if err := ckpt.RemoveTemps(ckpt.OS, filepath.Join(root, "none")); err != nil {
		t.Errorf("RemoveTemps of a missing root: %v", err)
	}
}

// TestWriteFileDiskFull: a file that does not fit a real file system (a
// 3 MiB tmpfs) fails with the kernel's ENOSPC, taken apart into the reason,
// the call and the file.
func TestWriteFileDiskFull(t *testing.T) {
	dir := ckpttest.Tmpfs(t, "size=3m")
	sp, err := ckpt.OS.Space(dir)
	if err != nil || sp.Free > 3<<20 || sp.Free < 2<<20 {
		t.Fatalf("Space of a 3 MiB tmpfs: %+v, %v", sp, err)
	}
	name := filepath.Join(dir, "rank-00001.safetensors")
	_, err = ckpt.WriteFile(ckpt.OS, name, []ckpt.Entry{{Name: "w", DType: tensor.Float32, Shape: []int{1 << 20}}}, [][]byte{make([]byte, 4<<20)}, nil)
	f := ckpt.FailureOf(1, err)
	if !errors.Is(err, syscall.ENOSPC) || f.Reason != "no space left on device" || f.Op != "writing" || f.Path != name || f.Errno != int(syscall.ENOSPC) {
		t.Errorf("error %v, failure %+v", err, f)
	}
}
