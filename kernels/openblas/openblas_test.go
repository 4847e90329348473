//go:build openblas

package openblas_test

import (
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
	var logged []string
	d, err := providers.New("openblas", func(msg string, kv ...any) { logged = append(logged, msg) })
	if err != nil {
		t.Fatal(err)
	}
	if len(logged) != 3 {
		t.Errorf("want 3 fallbacks logged (bias, gelu forward/backward), got %d", len(logged))
	}
	if got := d.Provider(tensor.CPU, kernels.OpGemm).Name(); got != "openblas" {
		t.Fatalf("gemm served by %s", got)
	}
	kerneltest.Run(t, kerneltest.Config{
		New: func(int) (kernels.Kernels, error) { return d, nil },
	})
}
