package logview

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// CollapseWindow is how long the console holds a line to see whether other
// ranks print the same one, which it then shows once as "ranks[1-7]: msg".
const CollapseWindow = 150 * time.Millisecond

// Time layouts: the console shows the time of day, the rank logs the full time.
const (
	ConsoleStamp = "15:04:05.000"
	FileStamp    = "2006-01-02T15:04:05.000Z07:00"
)

// LineGroup is a line printed by one or more ranks within the window.
type LineGroup struct {
	First time.Time
	Text  string
	Node  int
	Ranks []int
}

// FormatGroup is a group as the console and `launcher logs` show it: the
// time of its first line, "node:rank| " or "ranks[1-7]: ", and its text.
func FormatGroup(g *LineGroup) []byte {
	var b []byte
	b = g.First.AppendFormat(b, ConsoleStamp)
	b = append(b, ' ')
	if len(g.Ranks) == 1 {
		b = fmt.Appendf(b, "%d:%d| ", g.Node, g.Ranks[0])
	} else {
		b = append(b, "ranks["...)
		b = append(b, FormatRanks(g.Ranks)...)
		b = append(b, "]: "...)
	}
	b = append(b, g.Text...)
	return append(b, '\n')
}

// ContainsInt reports whether s holds v.
func ContainsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// FormatRanks renders ranks compactly: [0 1 2 3 5 7 8] -> "0-3,5,7-8".
func FormatRanks(ranks []int) string {
	r := append([]int(nil), ranks...)
	sort.Ints(r)
	var b strings.Builder
	for i := 0; i < len(r); {
		j := i
		for j+1 < len(r) && r[j+1] == r[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(r[i]))
		if j > i {
			b.WriteByte('-')
			b.WriteString(strconv.Itoa(r[j]))
		}
		i = j + 1
	}
	return b.String()
}

// maxRankSet bounds how many ranks a rank set may name in all: a set is a
// map, and "0-1048576,1048577-2097153,..." would otherwise cost memory
// without end.
const maxRankSet = 1 << 17

// ParseRanks reads "0,4-7" into a set of ranks.
func ParseRanks(s string) (map[int]bool, error) {
	set := map[int]bool{}
	total := 0
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("ranks %q: %q is not a rank or a range like 4-7", s, part)
		}
		b := a
		if isRange {
			b, err = strconv.Atoi(hi)
			if err != nil || b < a {
				return nil, fmt.Errorf("ranks %q: %q is not a range like 4-7", s, part)
			}
		}
		if total += b - a + 1; b-a > maxRankSet || total > maxRankSet {
			return nil, fmt.Errorf("ranks %q: more than %d ranks", s, maxRankSet)
		}
		for r := a; r <= b; r++ {
			set[r] = true
		}
	}
	return set, nil
}
