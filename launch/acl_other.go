//go:build unix && !linux

package launch

import (
	"errors"
	"os"
)

// setDefaultACL: only Linux's default ACLs are set; elsewhere the ranks' own
// files keep their umask's modes, behind the folders' modes.
func setDefaultACL(dir string, mode os.FileMode) error {
	return errors.ErrUnsupported
}
