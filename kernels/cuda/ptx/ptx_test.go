package ptx

import (
	"os"
	"strings"
	"testing"
)

// TestPTXFresh: the embedded PTX was generated from the CUDA sources as they
// are (gen.sh writes their hash into its first line); edit kernels.h, forget
// go generate, and this fails.
func TestPTXFresh(t *testing.T) {
	want, err := SourcesHash(".")
	if err != nil {
		t.Fatal(err)
	}
	ptx, err := os.ReadFile("kernels.ptx")
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(ptx), "\n")
	if !strings.Contains(first, "(sources "+want+")") {
		t.Fatalf("kernels.ptx is stale: its first line %q, the sources hash to %s; run go generate ./kernels/cuda/ptx", first, want)
	}
	for _, k := range []string{"gelu_f32", "gelu_grad_bf16", "mse_f32", "sum_stage", "axpy_bf16", "cast_f32_bf16"} {
		if !strings.Contains(string(ptx), ".entry "+k+"(") {
			t.Errorf("kernel %s missing from the PTX", k)
		}
	}
}
