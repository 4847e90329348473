package cpulimit

import (
	"slices"
	"testing"
)

// TestRankCores: ranks are packed onto the launcher's CPUs in order, each
// given the CPUs its share spans, wrapping around past the last.
func TestRankCores(t *testing.T) {
	allowed := []int{0, 1, 5, 7}
	for _, tc := range []struct {
		l    int
		x    float64
		want []int
	}{
		{0, 0.5, []int{0}}, {1, 0.5, []int{0}}, {2, 0.5, []int{1}}, {3, 0.5, []int{1}}, {7, 0.5, []int{7}},
		{0, 1, []int{0}}, {3, 1, []int{7}}, {4, 1, []int{0}},
		{0, 1.5, []int{0, 1}}, {1, 1.5, []int{1, 5}}, {2, 1.5, []int{0, 7}},
		{0, 0.3, []int{0}}, {2, 0.3, []int{0}}, {3, 0.3, []int{0, 1}}, {4, 0.3, []int{1}},
		{2, 2, []int{0, 1}},
	} {
		m := rankCores(allowed, tc.l, tc.x)
		if got := m.cores(); !slices.Equal(got, tc.want) {
			t.Errorf("rank %d at %v cores: CPUs %v, want %v", tc.l, tc.x, got, tc.want)
		}
	}
}
