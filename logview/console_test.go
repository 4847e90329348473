package logview

import (
	"bytes"
	"testing"
	"time"
)

func TestRanks(t *testing.T) {
	for _, tc := range []struct{ in, out string }{{"0,4-7", "0,4-7"}, {"3,1,2", "1-3"}, {"5", "5"}, {"0-0,2", "0,2"}} {
		set, err := ParseRanks(tc.in)
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		var rs []int
		for r := range set {
			rs = append(rs, r)
		}
		if got := FormatRanks(rs); got != tc.out {
			t.Errorf("%q -> %q, want %q", tc.in, got, tc.out)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "-1", "1,,2"} {
		if _, err := ParseRanks(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestConsoleCollapse: identical lines of several ranks within the window
// are one line, "ranks[1-3,7-8]: same", at the first one's time; a rank the
// filter hides is left out, and a rank's second line is a line of its own.
func TestConsoleCollapse(t *testing.T) {
	var out bytes.Buffer
	c := NewConsole(&out, time.Hour, func(r int) bool { return r != 5 })
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 6e6, time.UTC)
	for _, r := range []int{1, 2, 3, 5, 7, 8} {
		c.Add(RankLine{T: t0.Add(time.Duration(r) * time.Millisecond), Node: 0, Rank: r, Text: "same"})
	}
	c.Add(RankLine{T: t0.Add(10 * time.Millisecond), Node: 1, Rank: 4, Text: "own"})
	c.Add(RankLine{T: t0.Add(11 * time.Millisecond), Node: 0, Rank: 1, Text: "same"}) // rank 1 again: a new line
	c.Close()
	want := t0.Add(time.Millisecond).Local().Format(ConsoleStamp) + " ranks[1-3,7-8]: same\n" +
		t0.Add(10*time.Millisecond).Local().Format(ConsoleStamp) + " 1:4| own\n" +
		t0.Add(11*time.Millisecond).Local().Format(ConsoleStamp) + " 0:1| same\n"
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}
