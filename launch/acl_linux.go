package launch

import (
	"encoding/binary"
	"os"
	"syscall"
)

// setDefaultACL gives dir a default POSIX ACL of mode's owner, group and
// other permissions, with no named entries: whatever a process creates in
// dir then gets at most those permissions whatever its umask, and the folders
// it creates inherit the ACL. It fails on a file system without ACLs
// (EOPNOTSUPP).
func setDefaultACL(dir string, mode os.FileMode) error {
	// The kernel's posix_acl_xattr format: a version, then entries of a tag,
	// the permissions and an id (none for these three), little endian.
	const (
		version  = 2
		userObj  = 0x01
		groupObj = 0x04
		other    = 0x20
		noID     = 0xffffffff
	)
	perm := uint16(mode.Perm())
	b := binary.LittleEndian.AppendUint32(nil, version)
	for _, e := range [][2]uint16{{userObj, perm >> 6 & 7}, {groupObj, perm >> 3 & 7}, {other, perm & 7}} {
		b = binary.LittleEndian.AppendUint16(b, e[0])
		b = binary.LittleEndian.AppendUint16(b, e[1])
		b = binary.LittleEndian.AppendUint32(b, noID)
	}
	return syscall.Setxattr(dir, "system.posix_acl_default", b, 0)
}
