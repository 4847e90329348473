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

// loopProvider is the cpu provider with the generic grouped GEMM
// (kernels.GroupedLoop, one Gemm per expert on host windows).
type loopProvider struct{ *cpu.Provider }

func (p loopProvider) GroupedGemm(g kernels.GroupedParams, o kernels.GemmOperands) error {
	if err := kernels.CheckGrouped(g, o); err != nil {
		return err
	}
	return kernels.GroupedLoop(p.Provider, g, o, kernels.HostWindow)
}

// TestGroupedLoopConforms runs the suite on kernels.GroupedLoop, the grouped
// GEMM a provider without its own gets.
func TestGroupedLoopConforms(t *testing.T) {
	kerneltest.Run(t, kerneltest.Config{
		New: func(threads int) (kernels.Kernels, error) {
			p, err := cpu.New(cpu.Options{Threads: threads})
			return loopProvider{p}, err
		},
		DTypes: []tensor.DType{tensor.Float32, tensor.BFloat16},
		Short:  true,
	})
}
