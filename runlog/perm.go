package runlog

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// FileMode is the mode of a file written into dir, by a rank or by the
// launcher: the folder's owner and group read bits, never a bit for others.
// 0600 in a 0700 folder (a job's, by default), 0640 in a 0750 one (launcher
// run --share-logs); 0600 when dir cannot be read.
func FileMode(dir string) os.FileMode {
	st, err := os.Stat(dir)
	if err != nil {
		return 0o600
	}
	return 0o600 | st.Mode().Perm()&0o040
}

// OpenFile is os.OpenFile with the file's mode taken from its folder
// (FileMode), whatever the process's umask: a file it creates is set to that
// mode once open.
func OpenFile(name string, flag int) (*os.File, error) {
	mode := FileMode(filepath.Dir(name))
	f, err := os.OpenFile(name, flag, mode)
	if err != nil || flag&os.O_CREATE == 0 {
		return f, err
	}
	// The umask may have taken the group's bit; an older file of someone
	// else's (O_CREATE without O_EXCL) keeps its mode.
	if err := f.Chmod(mode); err != nil && !errors.Is(err, fs.ErrPermission) {
		f.Close()
		return nil, err
	}
	return f, nil
}

// writeFile is os.WriteFile through OpenFile.
func writeFile(name string, b []byte) error {
	f, err := OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
