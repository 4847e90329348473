//go:build cuda

package cuda_test

import (
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cuda"
	"github.com/meshrun/meshrun/kernels/kerneltest"
)

func TestConformance(t *testing.T) {
	p, err := cuda.New(0)
	if err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	defer p.Close()
	kerneltest.Run(t, kerneltest.Config{
		New:    func(int) (kernels.Kernels, error) { return p, nil },
		Memory: p.Memory(),
		Short:  true,
	})
}
