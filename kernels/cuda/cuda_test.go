//go:build cuda

package cuda

import (
	"os"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/kerneltest"
)

// open opens GPU 0 or skips, with the options of the test's environment
// (MESHRUN_CUDA_SYNC, MESHRUN_TF32, MESHRUN_CUBLASLT: bench/gpu/check.sh sets
// them).
func open(t *testing.T) *Provider {
	p, err := New(0, OptionsFrom(os.Getenv))
	if err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return p
}

// TestConformance runs the kernels conformance suite on the GPU (with
// MESHRUN_CUBLASLT=0, on the fallback plans).
func TestConformance(t *testing.T) {
	p := open(t)
	kerneltest.Run(t, kerneltest.Config{
		New:    func(int) (kernels.Kernels, error) { return p, nil },
		Memory: p.Memory(),
		Short:  true,
	})
}

// TestDispatchTable runs the suite on the GPU through the recorder and
// prints what served each call, as the provider took it (cuBLASLt's
// answers included); it fails on a call claimed but refused.
func TestDispatchTable(t *testing.T) {
	p := open(t)
	runTable(t, p, p.Memory(), func() string { return p.served })
}
