package ckpt

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// FS is the file system a checkpoint is written to and read from: the calls
// saving and loading make, so that tests can wrap it to inject faults (a write
// that fails, a process that dies halfway).
type FS interface {
	MkdirAll(dir string) error
	// Create creates (or truncates) a file for writing.
	Create(name string) (File, error)
	Open(name string) (File, error)
	Stat(name string) (fs.FileInfo, error)
	ReadDir(dir string) ([]fs.DirEntry, error)
	Rename(from, to string) error
	RemoveAll(name string) error
	// SyncDir makes a directory's entries (creations, renames) durable.
	SyncDir(dir string) error
	// Space says how much the file system holding dir can still take, and
	// which file system that is.
	Space(dir string) (Space, error)
}

// Space is the free space of the file system holding a folder.
type Space struct {
	// Free is the bytes an unprivileged writer can still use (statfs's
	// f_bavail blocks).
	Free int64 `json:"free"`
	// FS names the file system: folders that report the same FS draw on the
	// same free space (the host and the device number; a network file system
	// mounted on several hosts counts once per host).
	FS string `json:"fs"`
}

// File is an open file of an FS.
type File interface {
	io.Reader
	io.ReaderAt
	io.Writer
	Sync() error
	Close() error
}

// OS is the operating system's file system.
var OS FS = osFS{}

type osFS struct{}

func (osFS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o755) }
func (osFS) Create(name string) (File, error) {
	return os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
}
func (osFS) Open(name string) (File, error)            { return os.Open(name) }
func (osFS) Stat(name string) (fs.FileInfo, error)     { return os.Stat(name) }
func (osFS) ReadDir(dir string) ([]fs.DirEntry, error) { return os.ReadDir(dir) }
func (osFS) Rename(from, to string) error              { return os.Rename(from, to) }
func (osFS) RemoveAll(name string) error               { return os.RemoveAll(name) }
func (osFS) SyncDir(dir string) error                  { return syncDir(dir) }

func (osFS) Space(dir string) (Space, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return Space{}, &fs.PathError{Op: "statfs", Path: dir, Err: err}
	}
	var ds unix.Stat_t
	if err := unix.Stat(dir, &ds); err != nil {
		return Space{}, &fs.PathError{Op: "stat", Path: dir, Err: err}
	}
	return Space{Free: int64(st.Bavail) * int64(st.Bsize), FS: fmt.Sprintf("%s:%x", hostname, uint64(ds.Dev))}, nil
}

// hostname tells apart the file systems of different hosts with the same
// device number.
var hostname, _ = os.Hostname()

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	// Some file systems do not sync directories; that is not a failure.
	if errors.Is(err, os.ErrInvalid) {
		return nil
	}
	return err
}

// parentDir is the directory holding path.
func parentDir(path string) string { return filepath.Dir(filepath.Clean(path)) }

// NoSync wraps fsys so that File.Sync and SyncDir do nothing: a save then
// survives a process dying at any moment (the rename still commits it whole)
// but not the machine losing power before the kernel writes it back.
func NoSync(fsys FS) FS { return noSync{fsys} }

type noSync struct{ FS }

func (n noSync) Create(name string) (File, error) {
	f, err := n.FS.Create(name)
	if err != nil {
		return nil, err
	}
	return noSyncFile{f}, nil
}

func (noSync) SyncDir(string) error { return nil }

type noSyncFile struct{ File }

func (noSyncFile) Sync() error { return nil }
