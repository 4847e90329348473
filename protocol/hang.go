package protocol

import (
	"fmt"
	"sort"
	"time"
)

// Hang is a collective that has waited longer than a threshold, and the ranks
// of its group that have not entered it.
type Hang struct {
	Group   string
	Seq     uint64
	Op      string
	Since   time.Time
	Waiting []int // ranks inside the collective
	Missing []int // ranks of the group that never entered it
}

func (h Hang) String() string {
	return fmt.Sprintf("%s seq %d on group %s: ranks %v waiting since %s, missing ranks %v",
		h.Op, h.Seq, h.Group, h.Waiting, h.Since.Format(time.RFC3339Nano), h.Missing)
}

// Hangs reads the latest heartbeat of every rank (by rank) and returns the
// collectives that have been in flight longer than after, naming the missing
// ranks: those whose heartbeat shows a lower sequence number on that group (or
// no heartbeat at all).
func Hangs(latest map[int]State, now time.Time, after time.Duration) []Hang {
	type key struct {
		g string
		s uint64
	}
	found := map[key]*Hang{}
	var ranks []int
	for r := range latest {
		ranks = append(ranks, r)
	}
	sort.Ints(ranks)
	for _, r := range ranks {
		s := latest[r]
		if !s.Active || now.Sub(s.Since) < after {
			continue
		}
		k := key{s.Group, s.Seq}
		h := found[k]
		if h == nil {
			h = &Hang{Group: s.Group, Seq: s.Seq, Op: s.Op, Since: s.Since}
			found[k] = h
			for _, m := range s.Ranks {
				ms, ok := latest[m]
				if !ok || ms.Seqs[s.Group] < s.Seq {
					h.Missing = append(h.Missing, m)
				}
			}
		}
		if s.Since.Before(h.Since) {
			h.Since = s.Since
		}
		h.Waiting = append(h.Waiting, r)
	}
	var out []Hang
	for _, h := range found {
		out = append(out, *h)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Group < out[j].Group || out[i].Group == out[j].Group && out[i].Seq < out[j].Seq
	})
	return out
}
