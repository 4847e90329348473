//go:build openblas

package openblas_test

import (
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/kerneltest"
	"github.com/meshrun/meshrun/kernels/openblas"
	"github.com/meshrun/meshrun/kernels/providers"
)

// TestConformance runs the suite through a dispatcher, so the ops OpenBLAS lacks
// go to the cpu provider as they would in a rank.
func TestConformance(t *testing.T) {
	t.Log(openblas.Config())
	d, err := providers.New("openblas", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Provider(kernels.OpGemm).Name(); got != "openblas" {
		t.Fatalf("gemm served by %s", got)
	}
	if got := d.Provider(kernels.OpGemmBiasGelu).Name(); got != "cpu" {
		t.Fatalf("gemm_bias_gelu served by %s", got)
	}
	kerneltest.Run(t, kerneltest.Config{
		New: func(int) (kernels.Kernels, error) { return d, nil },
	})
}
