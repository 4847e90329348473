package collective

import (
	"strings"
	"testing"
	"time"
)

// TestCulprit: the rank a timeout blames, from the peers' last heartbeats.
// Rank 0 waits in all_reduce seq 124 of [0 1 2].
func TestCulprit(t *testing.T) {
	const key = "[0 1 2]"
	now := time.Now()
	ranks := []int{0, 1, 2}
	type hb struct {
		st  State
		ago time.Duration
	}
	in := func(seq uint64, active bool, ago time.Duration) hb {
		return hb{State{Group: key, Ranks: ranks, Seq: seq, Op: "all_reduce", Active: active, Seqs: map[string]uint64{key: seq}}, ago}
	}
	outside := hb{State{Seqs: map[string]uint64{key: 123}}, 0}
	for _, c := range []struct {
		name  string
		peers map[int]hb
		want  int
		says  string
		late  int // a rank whose first state request goes unanswered
	}{
		// Host 2's link went down: rank 1 still waits in seq 123 for it.
		{"blocked behind a silent rank", map[int]hb{1: in(123, true, 0), 2: in(124, true, 5*time.Second)}, 2, "rank 1 never entered it, still waiting in all_reduce seq 123", 0},
		{"silent and missing", map[int]hb{1: in(123, true, 0), 2: in(123, true, 5*time.Second)}, 2, "nothing heard from it for 5s", 0},
		{"never heard", map[int]hb{1: in(124, true, 0)}, 2, "no heartbeat ever heard", 0},
		{"stuck outside", map[int]hb{1: in(123, true, 0), 2: outside}, 2, "outside any collective", 0},
		{"blocked, nobody silent", map[int]hb{1: in(123, true, 0), 2: in(124, true, 0)}, 1, "in all_reduce seq 123", 0},
		{"everyone entered", map[int]hb{1: in(124, true, 0), 2: in(124, true, 0)}, -1, "", 0},
		// Under load a heartbeat comes late and a state request can go
		// unanswered: the rank just seen outside the collective is named,
		// not the one not heard (lately).
		{"stuck outside, another unheard", map[int]hb{2: outside}, 2, "outside any collective", 0},
		{"stuck outside, another late", map[int]hb{1: {outside.st, 3 * time.Second}, 2: outside}, 2, "outside any collective", 0},
		{"unheard once", map[int]hb{1: in(124, true, 0), 2: in(124, true, 0)}, -1, "", 1},
		{"unheard once, then outside", map[int]hb{1: outside, 2: in(124, true, 0)}, 1, "outside any collective", 1},
	} {
		asked := map[int]int{}
		peer := func(r int) (State, time.Time, bool) {
			asked[r]++
			if r == c.late && asked[r] == 1 {
				return State{}, time.Time{}, false
			}
			h, ok := c.peers[r]
			return h.st, now.Add(-h.ago), ok
		}
		r, why := culprit(0, key, 124, ranks, peer, now)
		if r != c.want || !strings.Contains(why, c.says) {
			t.Errorf("%s: blames rank %d (%q), want %d (%q)", c.name, r, why, c.want, c.says)
		}
	}
}
