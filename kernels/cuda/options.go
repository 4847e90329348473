package cuda

import (
	"fmt"
	"slices"
	"strings"
)

// Options are a provider's switches, given to New (the worker reads them from
// its environment: package job). The zero value is the default: ops do not
// wait for their work, TF32 is off, GEMMs take cuBLASLt where it serves them.
type Options struct {
	// Sync makes every op wait for its work, so that an error surfaces at
	// the op that caused it (EnvSync).
	Sync bool
	// TF32 allows TF32 tensor cores for float32 GEMMs (EnvTF32); off, float32
	// results match the cpu provider's to float32 rounding.
	TF32 bool
	// NoLt keeps every GEMM off cuBLASLt: each runs its fallback plan
	// (cuBLAS and the kernels), as when cuBLASLt refuses it; for checking
	// those plans on a GPU (EnvLt).
	NoLt bool
	// AttnKernels runs attention on the one-row-per-thread kernels rather
	// than through cuBLAS (EnvAttention); for checking them on a GPU.
	AttnKernels bool
	// AttnFused runs attention on the fused kernels (ptx's attn_flash_*: a
	// block per tile of rows, the scores never leaving it) where its head
	// dims fit them (EnvAttention=fused); checked in the emulation, not yet
	// timed on a GPU, so the cuBLAS path stays the default.
	AttnFused bool
	// LayerNormBlock runs layer norm's y and dx a block per row (ptx's
	// ln_block, ln_dx_block: one launch each instead of five and two) rather
	// than in stages (EnvLayerNorm=block); checked in the emulation, not yet
	// timed on a GPU.
	LayerNormBlock bool
	// BGradSplit runs a weight gradient with its bias gradient
	// (kernels.EpilogueBGrad) as a plain GEMM and the bias gradient apart
	// (ones·dy on cuBLAS), as PyTorch's linear backward does, instead of
	// cuBLASLt's BGRADB epilogue (EnvBGrad). On the H200 two runs of
	// bench/gpu/run.sh disagreed on which is faster at 512 to 8192 tokens
	// in bfloat16 (split 4–9% ahead in one, fused 0–4% in the other, the
	// table run second ahead each time: bench/gpu/results/2026-11-27-run4.md
	// and -run5.md), so the fused epilogue stays the default.
	BGradSplit bool
}

// The environment variables behind Options, as OptionsFrom reads them.
const (
	// EnvSync makes every op wait for its work when "1" (Options.Sync).
	EnvSync = "MESHRUN_CUDA_SYNC"
	// EnvTF32 allows TF32 tensor cores for float32 GEMMs when "1"
	// (Options.TF32).
	EnvTF32 = "MESHRUN_TF32"
	// EnvLt set to "0" keeps every GEMM off cuBLASLt (Options.NoLt).
	EnvLt = "MESHRUN_CUBLASLT"
	// EnvAttention set to "kernels" runs attention on the one-row-per-thread
	// kernels (Options.AttnKernels), "fused" on the fused ones
	// (Options.AttnFused); by default it goes through cuBLAS.
	EnvAttention = "MESHRUN_CUDA_ATTENTION"
	// EnvLayerNorm set to "block" runs layer norm a block per row
	// (Options.LayerNormBlock).
	EnvLayerNorm = "MESHRUN_CUDA_LAYERNORM"
	// EnvBGrad set to "split" runs the bias gradient apart from the weight
	// gradient's GEMM (Options.BGradSplit).
	EnvBGrad = "MESHRUN_BGRAD"
)

// OptionsFrom reads the options from getenv: MESHRUN_CUDA_SYNC=1,
// MESHRUN_TF32=1, MESHRUN_CUBLASLT=0, MESHRUN_CUDA_ATTENTION=kernels|fused,
// MESHRUN_CUDA_LAYERNORM=block,
// MESHRUN_BGRAD=split (none, or the default's own value, leaves the
// default: CheckEnv refuses any other).
func OptionsFrom(getenv func(string) string) Options {
	return Options{
		Sync:           getenv(EnvSync) == "1",
		TF32:           getenv(EnvTF32) == "1",
		NoLt:           getenv(EnvLt) == "0",
		AttnKernels:    getenv(EnvAttention) == "kernels",
		AttnFused:      getenv(EnvAttention) == "fused",
		LayerNormBlock: getenv(EnvLayerNorm) == "block",
		BGradSplit:     getenv(EnvBGrad) == "split",
	}
}

// envValues are the values each variable of OptionsFrom takes besides
// unset (the default).
var envValues = [][]string{
	{EnvSync, "1", "0"},
	{EnvTF32, "1", "0"},
	{EnvLt, "0", "1"},
	{EnvAttention, "kernels", "fused", "gemm"},
	{EnvLayerNorm, "block", "staged"},
	{EnvBGrad, "split", "fused"},
}

// CheckEnv refuses a variable of OptionsFrom set to a value it does not
// take (MESHRUN_CUDA_ATTENTION=fsued would otherwise leave the default
// without a word), naming the values it does.
func CheckEnv(getenv func(string) string) error {
	for _, e := range envValues {
		if v := getenv(e[0]); v != "" && !slices.Contains(e[1:], v) {
			return fmt.Errorf("%s=%s: want %s, or unset", e[0], v, strings.Join(e[1:], " or "))
		}
	}
	return nil
}
