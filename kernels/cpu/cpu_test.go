package cpu_test

import (
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/kernels/kerneltest"
	"github.com/meshrun/meshrun/tensor"
)

// TestConformance runs the suite for every micro-kernel this machine has
// (float32 and float64), and for every bfloat16 path.
func TestConformance(t *testing.T) {
	for _, name := range cpu.Kernels() {
		t.Run(name, func(t *testing.T) {
			kerneltest.Run(t, kerneltest.Config{
				New: func(threads int) (kernels.Kernels, error) {
					return cpu.New(cpu.Options{Threads: threads, Kernel: name})
				},
				Deterministic: true,
				DTypes:        []tensor.DType{tensor.Float32, tensor.Float64},
			})
		})
	}
	for _, name := range cpu.BF16Kernels() {
		t.Run("bf16_"+name, func(t *testing.T) {
			kerneltest.Run(t, kerneltest.Config{
				New: func(threads int) (kernels.Kernels, error) {
					return cpu.New(cpu.Options{Threads: threads, BF16: name})
				},
				Deterministic: true,
				DTypes:        []tensor.DType{tensor.BFloat16},
			})
		})
	}
}
