//go:build !linux

package cpulimit

import (
	"errors"
	"os/exec"
)

// Problem says why --cpus-per-rank cannot run here: it needs Linux.
func Problem(float64) string { return "--cpus-per-rank needs Linux's cpu cgroups" }

// Limit is a job's cgroups: none off Linux.
type Limit struct{}

// New refuses: no cgroups off Linux.
func New(string, float64) (*Limit, error) {
	return nil, errors.New("--cpus-per-rank needs Linux's cpu cgroups")
}

// Start starts cmd as it is.
func (c *Limit) Start(cmd *exec.Cmd, l int) error { return cmd.Start() }

// Pinned is false: there is no Limit off Linux.
func (c *Limit) Pinned() bool { return false }

// Procs has no cgroup to give.
func (c *Limit) Procs(int) (string, error) { return "", errors.New("no cgroups") }

// Close has nothing to remove.
func (c *Limit) Close() error { return nil }

// JobDir is "": no cgroups.
func JobDir(string) string { return "" }

// ThreadCPUs is unknown off Linux.
func ThreadCPUs() ([]int, error) { return nil, errors.New("no affinity") }
