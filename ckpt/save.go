package ckpt

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// What a save of several ranks shares: every rank's failure, the ranks'
// agreed verdict as one error (SaveError), and the free-space check made
// before anything is written. The ranks exchange these over their World
// (linear.SaveParams); this package does no collective work.

// RankFailure is why one rank could not do its part of a save, in a form
// that travels between ranks (JSON) and groups: the ranks that failed the
// same way are named together.
type RankFailure struct {
	Rank int `json:"rank"`
	// Reason is what went wrong: the system's words for a file system error
	// ("no space left on device"), else the whole error.
	Reason string `json:"reason"`
	// Op and Path say where, for a file system error: "writing" and the file.
	Op   string `json:"op,omitempty"`
	Path string `json:"path,omitempty"`
	// Errno is the system's error number (0: none), so that errors.Is(err,
	// syscall.ENOSPC) holds on every rank of a SaveError.
	Errno int `json:"errno,omitempty"`
}

// opWords are the file system calls a save makes, as a failure says them.
var opWords = map[string]string{
	"open": "creating", "write": "writing", "sync": "syncing", "fsync": "syncing", "close": "closing",
	"mkdir": "creating the folder", "mkdirall": "creating the folder", "rename": "renaming", "unlinkat": "removing",
	"remove": "removing", "statfs": "checking the free space of", "stat": "checking", "readdirent": "listing", "readdir": "listing",
}

// FailureOf is rank's failure for err: a file system error (*fs.PathError,
// *os.LinkError) is taken apart into the reason, the call and the path.
func FailureOf(rank int, err error) RankFailure {
	f := RankFailure{Rank: rank, Reason: err.Error()}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		f.Reason, f.Path = pe.Err.Error(), pe.Path
		f.Op = opWords[strings.ToLower(pe.Op)]
		if f.Op == "" {
			f.Op = pe.Op
		}
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		f.Errno = int(errno)
	}
	return f
}

// SaveError is a save that failed, the same on every rank: which ranks
// failed and why, what became of the temporary folder, and the newest
// checkpoint that is still whole. It blames the failed ranks
// (protocol.Blamer: the first of them; CulpritRanks: all).
type SaveError struct {
	Step int
	Root string // the folder of checkpoints
	// Failures lists the ranks that failed, by rank.
	Failures []RankFailure
	// Checked: the free-space check (or the preparation before it) failed,
	// before any rank wrote anything.
	Checked bool
	// Removed: the temporary folder the ranks wrote into was removed;
	// RemoveErr says why not, when that failed.
	Removed   bool
	RemoveErr string
	// Committed: the checkpoint is in place; what failed came after the
	// rename (the parent's fsync, removing older checkpoints).
	Committed bool
	// LastGood is the newest complete checkpoint under Root ("" when none).
	LastGood string
}

// Ranks lists the failed ranks, ascending.
func (e *SaveError) Ranks() []int {
	var rs []int
	for _, f := range e.Failures {
		if !slices.Contains(rs, f.Rank) {
			rs = append(rs, f.Rank)
		}
	}
	slices.Sort(rs)
	return rs
}

// CulpritRank is the lowest failed rank (protocol.Blamer): a launcher that
// takes one root cause takes a rank that failed, never one that succeeded.
func (e *SaveError) CulpritRank() int {
	if rs := e.Ranks(); len(rs) > 0 {
		return rs[0]
	}
	return -1
}

// CulpritRanks is every failed rank.
func (e *SaveError) CulpritRanks() []int { return e.Ranks() }

// Is matches the system error numbers of the failures: errors.Is(err,
// syscall.ENOSPC) for a full disk, or a free-space check that refused.
func (e *SaveError) Is(target error) bool {
	errno, ok := target.(syscall.Errno)
	if !ok {
		return false
	}
	for _, f := range e.Failures {
		if f.Errno == int(errno) {
			return true
		}
	}
	return false
}

func (e *SaveError) Error() string {
	var b strings.Builder
	if e.Committed {
		fmt.Fprintf(&b, "checkpoint step %d saved to %s, but ", e.Step, StepDir(e.Root, e.Step))
	} else {
		fmt.Fprintf(&b, "checkpoint step %d not saved: ", e.Step)
	}
	b.WriteString(FormatFailures(e.Failures))
	tmp := TempDir(e.Root, e.Step)
	switch {
	case e.Committed:
	case e.Checked:
		b.WriteString("; nothing was written")
	case e.Removed:
		fmt.Fprintf(&b, "; its partial folder %s was removed", tmp)
	case e.RemoveErr != "":
		fmt.Fprintf(&b, "; its partial folder %s could not be removed: %s", tmp, e.RemoveErr)
	}
	if !e.Committed {
		if e.LastGood != "" {
			fmt.Fprintf(&b, "; last good checkpoint: %s", e.LastGood)
		} else {
			fmt.Fprintf(&b, "; no checkpoint under %s yet", e.Root)
		}
	}
	return b.String()
}

// FormatFailures says the failures, the ranks that failed the same way
// together: "rank 0, 2, 3: no space left on device writing
// /ck/.tmp-step-00000040/rank-00000.safetensors, rank-00002.safetensors,
// rank-00003.safetensors; rank 1: ...".
func FormatFailures(fs []RankFailure) string {
	type group struct {
		ranks []int
		paths []string
		f     RankFailure
	}
	var groups []*group
	sorted := slices.Clone(fs)
	slices.SortStableFunc(sorted, func(a, b RankFailure) int { return a.Rank - b.Rank })
	for _, f := range sorted {
		var g *group
		for _, o := range groups {
			if o.f.Reason == f.Reason && o.f.Op == f.Op && (o.f.Path == "") == (f.Path == "") && filepath.Dir(o.f.Path) == filepath.Dir(f.Path) {
				g = o
				break
			}
		}
		if g == nil {
			g = &group{f: f}
			groups = append(groups, g)
		}
		if !slices.Contains(g.ranks, f.Rank) {
			g.ranks = append(g.ranks, f.Rank)
		}
		if f.Path != "" && !slices.Contains(g.paths, f.Path) {
			g.paths = append(g.paths, f.Path)
		}
	}
	parts := make([]string, len(groups))
	for i, g := range groups {
		s := fmt.Sprintf("%s: %s", FormatRanks(g.ranks), g.f.Reason)
		if g.f.Op != "" || len(g.paths) > 0 {
			s += " " + strings.TrimSpace(g.f.Op)
		}
		for j, p := range g.paths {
			if j > 0 {
				s += ","
				p = filepath.Base(p)
			}
			s += " " + p
		}
		parts[i] = s
	}
	return strings.Join(parts, "; ")
}

// FormatRanks says a list of ranks: "rank 3", "rank 0, 2, 3".
func FormatRanks(ranks []int) string {
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = strconv.Itoa(r)
	}
	return "rank " + strings.Join(s, ", ")
}

// FileSize is the size of the safetensors file WriteFile writes for
// entries: the header and the data.
func FileSize(entries []Entry, meta map[string]string) (int64, error) {
	es := slices.Clone(entries)
	hdr, err := EncodeHeader(es, meta)
	if err != nil {
		return 0, err
	}
	n := int64(len(hdr))
	if len(es) > 0 {
		n += es[len(es)-1].End
	}
	return n, nil
}

// SpaceMargin is what a save asks of a file system beyond the bytes of the
// files it writes there (need): the index, the folders, the blocks the
// files' ends round up to and the file system's own metadata: 1 MiB and 1%.
func SpaceMargin(need int64) int64 { return 1<<20 + need/100 }

// SpacePlan is one rank's part of the free-space check: the bytes it will
// write (0: it writes no file) and the free space it sees where it writes.
type SpacePlan struct {
	Rank  int
	Need  int64
	Space Space
}

// CheckSpace is the free-space check of a save, before anything is written:
// the ranks writing to one file system need the sum of their files and
// SpaceMargin of it, against the least free space any of them saw there.
// Each rank of a file system that cannot take its share fails, with what it
// needs and what is free (ENOSPC); nil when every file system can.
func CheckSpace(root string, plans []SpacePlan) []RankFailure {
	byFS := map[string][]SpacePlan{}
	var order []string
	for _, p := range plans {
		if p.Need <= 0 {
			continue
		}
		if _, ok := byFS[p.Space.FS]; !ok {
			order = append(order, p.Space.FS)
		}
		byFS[p.Space.FS] = append(byFS[p.Space.FS], p)
	}
	var fails []RankFailure
	for _, key := range order {
		ps := byFS[key]
		var total int64
		free := ps[0].Space.Free
		for _, p := range ps {
			total += p.Need
			free = min(free, p.Space.Free)
		}
		margin := SpaceMargin(total)
		if total+margin <= free {
			continue
		}
		lo, hi := ps[0].Need, ps[0].Need
		for _, p := range ps {
			lo, hi = min(lo, p.Need), max(hi, p.Need)
		}
		var what string
		switch {
		case len(ps) == 1:
			what = "a file of " + FormatBytes(total)
		case FormatBytes(lo) == FormatBytes(hi):
			what = fmt.Sprintf("%d files of %s, %s", len(ps), FormatBytes(lo), FormatBytes(total))
		default:
			what = fmt.Sprintf("%d files of %s to %s, %s", len(ps), FormatBytes(lo), FormatBytes(hi), FormatBytes(total))
		}
		needS, freeS := FormatBytes(total+margin), FormatBytes(free)
		if needS == freeS {
			needS, freeS = fmt.Sprintf("%d bytes", total+margin), fmt.Sprintf("%d bytes", free)
		}
		reason := fmt.Sprintf("not enough free space on the file system of %s: the save needs %s there (%s, and a margin of %s), %s is free",
			root, needS, what, FormatBytes(margin), freeS)
		for _, p := range ps {
			fails = append(fails, RankFailure{Rank: p.Rank, Reason: reason, Errno: int(syscall.ENOSPC)})
		}
	}
	return fails
}

// FormatBytes says a size in B, KiB, MiB or GiB.
func FormatBytes(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
}

// RemoveTemps removes the temporary folders under root of saves that never
// finished (a rank killed in the middle of one): they hold space a save
// needs. Only the rank that commits calls it, when no save is under way.
// A root that does not exist holds none.
func RemoveTemps(fsys FS, root string) error {
	ents, err := fsys.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-step-") {
			if err := fsys.RemoveAll(filepath.Join(root, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// Newest is the folder of the newest complete checkpoint under root, ""
// when there is none.
func Newest(fsys FS, root string) string {
	steps, err := Steps(fsys, root)
	if err != nil || len(steps) == 0 {
		return ""
	}
	return StepDir(root, steps[len(steps)-1])
}
