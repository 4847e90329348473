// Package ckpttest damages checkpoint files for tests of what reads them,
// and wraps a file system with faults for tests of what writes them.
package ckpttest

import (
	"io/fs"
	"os"
	"os/exec"
	"testing"

	"github.com/meshrun/meshrun/ckpt"
)

// FlipByte inverts one byte of a file: at off, or at size+off when off < 0.
func FlipByte(t testing.TB, name string, off int64) {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if off < 0 {
		off += int64(len(b))
	}
	b[off] ^= 0xff
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// FS wraps a ckpt.FS with faults and hooks, for tests of what a save does
// when the file system fails it. Every hook is optional; a hook's error is
// returned as the system's would be (an *fs.PathError).
type FS struct {
	ckpt.FS
	// OnCreate, when it returns an error, fails the creation of name.
	OnCreate func(name string) error
	// OnWrite, when it returns an error, fails a write to name at offset off
	// (the bytes written so far), writing none of it.
	OnWrite func(name string, off int64) error
	// OnClose is called once a file created through the FS is closed.
	OnClose func(name string)
	// OnSpace rewrites what Space reports (a free space that lies, as when
	// another writer fills the disk after the check).
	OnSpace func(dir string, sp ckpt.Space) ckpt.Space
}

// Create creates name through the hooks.
func (f *FS) Create(name string) (ckpt.File, error) {
	if f.OnCreate != nil {
		if err := f.OnCreate(name); err != nil {
			return nil, &fs.PathError{Op: "open", Path: name, Err: err}
		}
	}
	file, err := f.FS.Create(name)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f, name: name}, nil
}

// Space is the wrapped FS's, through OnSpace.
func (f *FS) Space(dir string) (ckpt.Space, error) {
	sp, err := f.FS.Space(dir)
	if err == nil && f.OnSpace != nil {
		sp = f.OnSpace(dir, sp)
	}
	return sp, err
}

type faultFile struct {
	ckpt.File
	fs   *FS
	name string
	off  int64
}

func (w *faultFile) Write(p []byte) (int, error) {
	if w.fs.OnWrite != nil {
		if err := w.fs.OnWrite(w.name, w.off); err != nil {
			return 0, &fs.PathError{Op: "write", Path: w.name, Err: err}
		}
	}
	n, err := w.File.Write(p)
	w.off += int64(n)
	return n, err
}

func (w *faultFile) Close() error {
	err := w.File.Close()
	if w.fs.OnClose != nil {
		w.fs.OnClose(w.name)
	}
	return err
}

// Tmpfs mounts a tmpfs with options opts (e.g. "size=3m", "size=3m,nr_inodes=9")
// on a fresh folder and unmounts it when the test ends. It needs root (CI
// runs as root); elsewhere the test skips.
func Tmpfs(t testing.TB, opts string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", opts, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a small tmpfs here (needs root): %v %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v %s", dir, err, out)
			exec.Command("umount", "-l", dir).Run()
		}
	})
	return dir
}
