package launch

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/meshrun/meshrun/runlog"
)

// A job folder holds what its ranks print, their data addresses, the command
// and environment and, while the job runs, its NATS credentials: it is the
// user's alone unless they share it with a group (docs/launcher.md, "On
// disk"). Folders are 0700 and files 0600, whatever the umask; with
// --share-logs GROUP, folders are 0750 with the set-group-ID bit and files
// 0640, all of GROUP (the NATS credentials stay 0600). Files take their mode
// from their folder (runlog.FileMode), the launcher's and the ranks' alike;
// the job folder's default ACL gives what any rank program creates in it the
// same modes, whatever its umask, where the file system has ACLs.

// logPerms are the modes of a job's folders and files.
type logPerms struct {
	// gid is --share-logs' group; -1: none, the job's files are private.
	gid int
}

// dirMode is the mode of the job's folders.
func (p logPerms) dirMode() os.FileMode {
	if p.gid < 0 {
		return 0o700
	}
	// New files and folders in it get its group.
	return 0o750 | os.ModeSetgid
}

// apply gives dir the job's group and mode.
func (p logPerms) apply(dir string) error {
	if p.gid >= 0 {
		// Before the mode: a change of group may clear the set-group-ID bit.
		if err := os.Chown(dir, -1, p.gid); err != nil {
			return err
		}
	}
	return os.Chmod(dir, p.dirMode())
}

// logPerms resolves --share-logs GROUP, a group name or id. The folders are
// given to the group as the kernel lets chgrp do it: the user must be in the
// group (root may name any), else the job is refused before it starts.
func (o RunOptions) logPerms() (logPerms, error) {
	if o.ShareLogs == "" {
		return logPerms{gid: -1}, nil
	}
	name := o.ShareLogs
	gid, err := strconv.Atoi(name)
	if err == nil {
		if gid < 0 {
			return logPerms{gid: -1}, fmt.Errorf("--share-logs %s: want a group name or id", name)
		}
		if g, err := user.LookupGroupId(name); err == nil {
			name = g.Name
		}
	} else {
		g, lerr := user.LookupGroup(name)
		if lerr != nil {
			return logPerms{gid: -1}, fmt.Errorf("--share-logs %s: no such group", name)
		}
		if gid, err = strconv.Atoi(g.Gid); err != nil {
			return logPerms{gid: -1}, fmt.Errorf("--share-logs %s: group id %q", name, g.Gid)
		}
	}
	if !inGroup(gid) {
		return logPerms{gid: -1}, fmt.Errorf("--share-logs %s: you are not in group %s (gid %d), so the job's folders cannot be given to it (id -Gn lists your groups)",
			o.ShareLogs, name, gid)
	}
	return logPerms{gid: gid}, nil
}

// inGroup reports whether this process may give its files to group gid.
func inGroup(gid int) bool {
	if os.Geteuid() == 0 || os.Getegid() == gid {
		return true
	}
	groups, _ := os.Getgroups()
	return slices.Contains(groups, gid)
}

// makeJobDir makes the job's folder. A --log-dir that does not exist is made
// with the job's folder mode (one that exists is left as it is); the job's
// own folder gets the job's mode even when it exists, and a default ACL of
// that mode.
func (j *job) makeJobDir() error {
	if err := os.MkdirAll(filepath.Dir(j.LogDir), 0o755); err != nil {
		return err
	}
	switch err := os.Mkdir(j.LogDir, 0o700); {
	case err == nil:
		if err := j.perms.apply(j.LogDir); err != nil {
			return err
		}
	case !errors.Is(err, fs.ErrExist):
		return err
	}
	if err := j.makeDir(j.dir); err != nil {
		return err
	}
	// Best effort: a file system without ACLs leaves the ranks' own files
	// to their umask, behind the folders' modes.
	setDefaultACL(j.dir, j.perms.dirMode())
	return nil
}

// makeDir makes one of the job's folders (its own, an attempt's, a rank's)
// with the job's mode, whatever the umask.
func (j *job) makeDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return j.perms.apply(dir)
}

// createFile creates (truncates) a file of the job with its folder's mode.
func createFile(name string) (*os.File, error) {
	return runlog.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC)
}
