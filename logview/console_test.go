package logview

import "testing"

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
