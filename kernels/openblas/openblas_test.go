//go:build openblas

package openblas_test

import (
	"strings"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/kerneltest"
	"github.com/meshrun/meshrun/kernels/openblas"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/tensor"
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

// TestNoBF16: asking for bfloat16 with the openblas provider is an error that
// names the provider and the dtype, never a quiet float32 run.
func TestNoBF16(t *testing.T) {
	c, err := kernels.ParseChoice("openblas")
	if err != nil {
		t.Fatal(err)
	}
	err = providers.CheckDType(c, tensor.BFloat16)
	if err == nil || !strings.Contains(err.Error(), "openblas") || !strings.Contains(err.Error(), "bfloat16") {
		t.Fatalf("openblas with bfloat16: %v", err)
	}
	if err := providers.CheckDType(c, tensor.Float32); err != nil {
		t.Fatal(err)
	}
}
