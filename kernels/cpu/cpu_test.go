package cpu_test

import (
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/kernels/kerneltest"
)

// TestConformance runs the suite for every micro-kernel this machine has.
func TestConformance(t *testing.T) {
	for _, name := range cpu.Kernels() {
		t.Run(name, func(t *testing.T) {
			kerneltest.Run(t, kerneltest.Config{
				New: func(threads int) (kernels.Kernels, error) {
					return cpu.New(cpu.Options{Threads: threads, Kernel: name})
				},
				Deterministic: true,
			})
		})
	}
}
