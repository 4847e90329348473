//go:build !linux

package launch

import (
	"errors"
	"os/exec"
)

func cpuLimitProblem() string { return "--cpus-per-rank needs Linux's cpu cgroups" }

type cpuLimit struct{}

func newCPULimit(string, float64) (*cpuLimit, error) {
	return nil, errors.New("--cpus-per-rank needs Linux's cpu cgroups")
}

func (c *cpuLimit) rank(int) (string, error)         { return "", nil }
func (c *cpuLimit) close() error                     { return nil }
func (c *cpuLimit) start(cmd *exec.Cmd, l int) error { return cmd.Start() }
