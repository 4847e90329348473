package transport

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/meshrun/meshrun/collective"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Ring names. Every name a ring (or arena) of the job can have is drawn from
// the job's secret, which rank 0 draws afresh for each rendezvous and which
// reaches the job's ranks only in the roster, over the job's authenticated
// NATS connection: the name of try k of the ring from src to dst is
// meshrun-<HMAC-SHA256(secret, src's ring token, src, dst, k), 16 bytes in
// hex>. The names are visible to every user of the machine as soon as the
// files exist (anyone may list /dev/shm), but one name tells nothing of any
// other: a user who watches /dev/shm cannot create a ring's name before its
// producer does, and a name seen is already taken (by a file of mode 0600
// that no other user may open, nor, the directory being sticky, remove or
// rename). The producer creates its file exclusively (O_EXCL|O_NOFOLLOW,
// mode 0600); should the name be taken anyway, it logs the file and its
// owner and takes the next of shmNameTries, and when every one is taken it
// fails with ErrAuth naming the files' owners, blaming no rank. The
// consumer maps only a regular file of its own user, not open to others, of
// the ring's size, that carries the magic and the producer's token, and
// passes over anything else found at these names. Nothing of the job (no
// token, no job id, no rank) appears in a name. See docs/collective.md,
// "Shared memory and other users of the machine".
const (
	// ShmTokenBytes is the size of a rank's ring token (Announce.Shm, in hex).
	ShmTokenBytes = 16
	shmNameTries  = 4
	shmNameBytes  = 16
	offToken      = 512 // producer: its token (ShmTokenBytes)
)

// shmNames derives the job's ring names from its secret and every rank's
// ring token (the roster's).
type shmNames struct {
	secret []byte
	tokens [][]byte
}

func newShmNames(roster *collective.Roster, reporter int) (*shmNames, error) {
	if len(roster.Secret) < 16 {
		return nil, &collective.Error{Kind: collective.ErrInvalid, Rank: -1, Reporter: reporter, Detail: fmt.Sprintf("shm setup: the roster carries no job secret to name the rings with (%d bytes)", len(roster.Secret))}
	}
	n := &shmNames{secret: roster.Secret, tokens: make([][]byte, len(roster.Ranks))}
	for i, a := range roster.Ranks {
		b, err := hex.DecodeString(a.Shm)
		if err != nil || len(b) != ShmTokenBytes || hex.EncodeToString(b) != a.Shm {
			return nil, &collective.Error{Kind: collective.ErrInvalid, Rank: i, Reporter: reporter, Detail: fmt.Sprintf("shm setup: rank %d announced no ring token (%q)", i, a.Shm)}
		}
		n.tokens[i] = b
	}
	return n, nil
}

// path is the name of try of the ring from src to dst (dst == src: src's arena).
func (n *shmNames) path(src, dst, try int) string {
	m := hmac.New(sha256.New, n.secret)
	m.Write([]byte("meshrun shm ring name\x00"))
	m.Write(n.tokens[src])
	var b [24]byte
	binary.LittleEndian.PutUint64(b[0:], uint64(src))
	binary.LittleEndian.PutUint64(b[8:], uint64(dst))
	binary.LittleEndian.PutUint64(b[16:], uint64(try))
	m.Write(b[:])
	return filepath.Join(shmDir, "meshrun-"+hex.EncodeToString(m.Sum(nil)[:shmNameBytes]))
}

// testHookShmCreate, set by tests only, runs before a ring file is created
// at path (try of the ring from src to dst): a test plants a file there to
// stand for someone who learned the name.
var testHookShmCreate func(path string, src, dst, try int)

// createRing creates and maps the ring from src to dst under the first free
// of its names.
func createRing(names *shmNames, src, dst int, log *zap.Logger, prefault bool, capacity int) (*shmRing, error) {
	var taken []string
	for try := 0; try < shmNameTries; try++ {
		path := names.path(src, dst, try)
		if testHookShmCreate != nil {
			testHookShmCreate(path, src, dst, try)
		}
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) {
			taken = append(taken, path)
			log.Warn("shm ring name taken by a file this job did not create; trying another",
				zap.String("file", describeFile(path)), zap.String("owner", fileOwners([]string{path})), zap.Int("try", try+1), zap.Int("tries", shmNameTries))
			continue
		}
		if err != nil {
			return nil, &collective.Error{Kind: collective.ErrInvalid, Rank: -1, Detail: fmt.Sprintf("shm setup: creating ring %s: %v", path, err)}
		}
		f := os.NewFile(uintptr(fd), path)
		r, err := initRing(f, names.tokens[src], prefault, capacity)
		f.Close()
		if err != nil {
			os.Remove(path)
			detail := fmt.Sprintf("shm setup: ring %s: %v", path, err)
			if errors.Is(err, unix.ENOSPC) {
				detail += fmt.Sprintf(" (%s is full: every user's files there count; MESHRUN_TRANSPORT=tcp does without it)", shmDir)
			}
			return nil, &collective.Error{Kind: collective.ErrInvalid, Rank: -1, Detail: detail}
		}
		return r, nil
	}
	return nil, takenError(src, dst, taken)
}

// takenError is the failure of a ring every name of which another process
// holds: it names the files' owners and blames no rank (Rank -1).
func takenError(src, dst int, paths []string) *collective.Error {
	what := fmt.Sprintf("the ring from rank %d to rank %d", src, dst)
	if src == dst {
		what = fmt.Sprintf("the shared-memory arena of rank %d", src)
	}
	described := make([]string, len(paths))
	for i, p := range paths {
		described[i] = describeFile(p)
	}
	return &collective.Error{Kind: collective.ErrAuth, Rank: -1, Detail: fmt.Sprintf("shm setup: all %d names this job drew for %s are taken by files of %s, which no rank of this job made (no rank is at fault): %s",
		len(paths), what, fileOwners(paths), strings.Join(described, ", "))}
}

// fileOwners names the owners of the files at paths: "uid 65534", "uids
// 1000, 65534"; an owner that is this process's user is said to be so.
func fileOwners(paths []string) string {
	var uids []uint32
	for _, p := range paths {
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil && !slices.Contains(uids, st.Uid) {
			uids = append(uids, st.Uid)
		}
	}
	slices.Sort(uids)
	if len(uids) == 0 {
		return "owners unknown (gone since)"
	}
	words := make([]string, len(uids))
	for i, u := range uids {
		words[i] = strconv.FormatUint(uint64(u), 10)
		if int(u) == os.Geteuid() {
			words[i] += " (this job's own user)"
		}
	}
	if len(uids) == 1 {
		return "uid " + words[0]
	}
	return "uids " + strings.Join(words, ", ")
}

// describeFile names path with its owner and mode, for errors and logs.
func describeFile(path string) string {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return path
	}
	return fmt.Sprintf("%s (owner uid %d, mode %#o)", path, st.Uid, st.Mode&0o7777)
}

// openRing maps the ring from src to dst once its producer has made it.
func openRing(ctx context.Context, names *shmNames, src, dst int, prefault bool, capacity int, unlink bool) (*shmRing, error) {
	token := names.tokens[src]
	paths := make([]string, shmNameTries)
	for try := range paths {
		paths[try] = names.path(src, dst, try)
	}
	seen := make([]string, shmNameTries) // what each name held that was not the ring
	for {
		foreign := 0
		for try, path := range paths {
			r, why, alien := tryOpenRing(path, token, prefault, capacity, unlink)
			if r != nil {
				return r, nil
			}
			seen[try] = why
			if alien {
				foreign++
			}
		}
		if foreign == shmNameTries {
			// The producer cannot create the ring under any name.
			return nil, takenError(src, dst, paths)
		}
		select {
		case <-ctx.Done():
			var found []string
			for _, w := range seen {
				if w != "" {
					found = append(found, w)
				}
			}
			if len(found) > 0 {
				return nil, fmt.Errorf("ring %s never appeared (passed over: %s): %w", paths[0], strings.Join(found, ", "), ctx.Err())
			}
			return nil, fmt.Errorf("ring %s never appeared: %w", paths[0], ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// tryOpenRing maps the ring at path if it is there, complete and ours, and
// unlinks it (both ends have it mapped: nothing is left behind). Otherwise why
// says what path holds ("" if nothing), and alien whether it is a file this
// job cannot have made (another owner, not a regular file, open to others).
func tryOpenRing(path string, token []byte, prefault bool, capacity int, unlink bool) (r *shmRing, why string, alien bool) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, "", false
	}
	if err != nil {
		return nil, fmt.Sprintf("%s: %v", describeFile(path), err), true
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Sprintf("%s: %v", path, err), false
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return nil, path + ": not a regular file", true
	case st.Uid != uint32(os.Geteuid()):
		return nil, fmt.Sprintf("%s: owned by uid %d, not %d", path, st.Uid, os.Geteuid()), true
	case st.Mode&0o077 != 0:
		return nil, fmt.Sprintf("%s: mode %#o, open to others", path, st.Mode&0o7777), true
	case st.Size != int64(shmCtrl+capacity):
		return nil, fmt.Sprintf("%s: %d bytes, not a ring (yet)", path, st.Size), false
	}
	mem, err := syscall.Mmap(fd, 0, shmCtrl+capacity, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Sprintf("%s: %v", path, err), false
	}
	r = &shmRing{mem: mem, data: mem[shmCtrl:], cap: uint64(capacity), path: path}
	if atomic.LoadUint64(r.u64(offMagic)) != shmMagic {
		syscall.Munmap(mem)
		return nil, path + ": no ring header (yet)", false
	}
	if !bytes.Equal(mem[offToken:offToken+ShmTokenBytes], token) {
		syscall.Munmap(mem)
		return nil, path + ": a ring of another producer", false
	}
	if prefault {
		populate(r.data, false)
	}
	if !unlink {
		return r, "", false // an arena: its owner unlinks it once every peer has it
	}
	atomic.StoreUint32(r.u32(offConsPID), uint32(os.Getpid()))
	r.dev, r.ino = st.Dev, st.Ino
	r.unlink()
	return r, "", false
}

// ShmRingPaths lists every name the rings and arenas of the job of roster
// can have (every try of every ordered pair of ranks, and of each rank to
// itself).
func ShmRingPaths(r *collective.Roster) []string {
	names, err := newShmNames(r, -1)
	if err != nil {
		return nil
	}
	var paths []string
	for src := range r.Ranks {
		for dst := range r.Ranks {
			for try := 0; try < shmNameTries; try++ {
				paths = append(paths, names.path(src, dst, try))
			}
		}
	}
	return paths
}
