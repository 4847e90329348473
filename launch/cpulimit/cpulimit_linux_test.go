package cpulimit

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
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

// TestPinnedOnly: a whole number of cores per rank is pinned only, with or
// without a cpu cgroup to make (no cgroup file to join, nothing to
// remove); a fraction of a core, which only a quota can cap, is refused
// where no cgroup can be made.
func TestPinnedOnly(t *testing.T) {
	none := errors.New("no cpu cgroup controller is mounted")
	defer func(f func() (cgroupRoot, error)) { findCgroup = f }(findCgroup)
	findCgroup = func() (cgroupRoot, error) { return cgroupRoot{}, none }
	testPinned(t, "whole")
	dir := t.TempDir() // a cgroup the launcher may make, that New must not use
	findCgroup = func() (cgroupRoot, error) { return cgroupRoot{mount: dir, own: "/", v2: true}, nil }
	testPinned(t, "whole-with-cgroups")
}

// testPinned: the refusals and the pinning of TestPinnedOnly, where a
// cgroup is as findCgroup says.
func testPinned(t *testing.T, job string) {
	t.Helper()
	_, noCgroup := usableCgroup()
	if p := Problem(0.5); noCgroup != nil && (!strings.Contains(p, "needs a cpu cgroup") || !strings.Contains(p, noCgroup.Error())) {
		t.Errorf("Problem(0.5) = %q, want the cgroup it needs", p)
	}
	if p := Problem(1); p != "" {
		t.Errorf("Problem(1) = %q, want none: pinning caps a whole core", p)
	}
	if p := Problem(0.5); noCgroup == nil && p != "" {
		t.Errorf("Problem(0.5) = %q with a cgroup to make", p)
	}
	if noCgroup != nil {
		if _, err := New("half", 0.5); !errors.Is(err, noCgroup) {
			t.Errorf("New at 0.5 cores: %v, want %v", err, noCgroup)
		}
	}
	c, err := New(job, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Pinned() {
		t.Errorf("%s: not pinned only", job)
	}
	if procs, err := c.Procs(0); procs != "" || err != nil {
		t.Errorf("Procs(0) = %q, %v; want no cgroup to join", procs, err)
	}
	own, err := ThreadCPUs()
	if err != nil {
		t.Fatal(err)
	}
	for l := range min(2, len(own)) {
		var out strings.Builder
		cmd := exec.Command("/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status")
		cmd.Stdout = &out
		if err := c.Start(cmd, l); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("Cpus_allowed_list:\t%d\n", own[l]); out.String() != want {
			t.Errorf("rank %d: %q, want %q", l, out.String(), want)
		}
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if r, _ := findCgroup(); r.mount != "" {
		if left, _ := os.ReadDir(r.mount); len(left) > 0 {
			t.Errorf("%s: a whole core made cgroups: %v", job, left)
		}
	}
}
