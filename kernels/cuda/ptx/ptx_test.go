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
	for _, k := range []string{"gelu_f32", "gelu_grad_bf16", "mse_f32", "sum_stage", "axpy_bf16", "cast_f32_bf16", "attn_flash_fwd_f32", "attn_flash_dq_bf16", "attn_flash_dkv_f32", "ln_block_bf16", "ln_dx_block_f32"} {
		if !strings.Contains(string(ptx), ".entry "+k+"(") {
			t.Errorf("kernel %s missing from the PTX", k)
		}
	}
}

// TestEmbedChunks: the embedding gradient's chunks of tokens: one per 64
// tokens while their double sums fit EmbedPartBytes, fewer where a chunk's
// table is large, none (one thread per column) where two do not fit or
// there is a single token.
func TestEmbedChunks(t *testing.T) {
	for _, tc := range []struct{ n, rows, d, want int }{
		{4096, 65, 768, 64},   // a character vocabulary: 64 chunks of 64 tokens
		{4096, 256, 768, 42},  // positions of a context of 256: 1.5 MiB a chunk
		{4096, 50257, 768, 0}, // GPT-2's vocabulary: 309 MB a chunk
		{100, 10, 8, 2},
		{1, 10, 8, 0},
		{0, 10, 8, 0},
	} {
		if got := EmbedChunks(tc.n, tc.rows, tc.d); got != tc.want {
			t.Errorf("EmbedChunks(%d, %d, %d) = %d, want %d", tc.n, tc.rows, tc.d, got, tc.want)
		}
		if k := EmbedChunks(tc.n, tc.rows, tc.d); k > 0 && k*tc.rows*tc.d*8 > EmbedPartBytes {
			t.Errorf("EmbedChunks(%d, %d, %d) = %d: %d bytes of sums", tc.n, tc.rows, tc.d, k, k*tc.rows*tc.d*8)
		}
	}
}
