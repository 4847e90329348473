package bootstrap

import (
	"testing"

	"github.com/meshrun/meshrun/transport"
)

// TestEnvShm: the shm settings reach the transport's options from the
// environment: a count of 0 is none, anything not a non-negative integer
// leaves the default.
func TestEnvShm(t *testing.T) {
	for _, tc := range []struct {
		spin, single, arena string
		want                transport.ShmOptions
	}{
		{"", "", "", transport.ShmOptions{}},
		{"0", "1", "0", transport.ShmOptions{Spin: -1, SingleCopy: true, ArenaBytes: -1}},
		{"64", "0", "1048576", transport.ShmOptions{Spin: 64, ArenaBytes: 1 << 20}},
		{"-3", "yes", "lots", transport.ShmOptions{}},
	} {
		t.Setenv("MESHRUN_SHM_SPIN", tc.spin)
		t.Setenv("MESHRUN_SHM_SINGLE_COPY", tc.single)
		t.Setenv("MESHRUN_SHM_ARENA", tc.arena)
		if got := EnvConfig().Shm; got != tc.want {
			t.Errorf("MESHRUN_SHM_SPIN=%q MESHRUN_SHM_SINGLE_COPY=%q MESHRUN_SHM_ARENA=%q: %+v, want %+v", tc.spin, tc.single, tc.arena, got, tc.want)
		}
	}
}
