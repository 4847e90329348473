package cuda

import "strconv"

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
	// BGradSplit runs every weight gradient with its bias gradient
	// (kernels.EpilogueBGrad) as a plain GEMM and the bias gradient apart
	// (ones·dy on cuBLAS), as PyTorch's linear backward does, and BGradFused
	// every one on cuBLASLt's BGRADB epilogue (EnvBGrad). Neither: bfloat16
	// ones over 512 tokens or more split, the rest fuse (bgradSplit).
	BGradSplit, BGradFused bool
	// LtAlgos is how many of cuBLASLt's heuristic candidates the first call
	// of each GEMM (shape, dtypes, layout, epilogue) times on its own
	// operands, keeping the fastest (EnvLtAlgos); 0 or 1 keeps the
	// heuristic's first pick untimed, as PyTorch does. A timed pick can
	// differ between runs; 1 makes a run's GEMMs repeat bit for bit.
	LtAlgos int
}

// MaxLtAlgos is the most candidates LtAlgos times.
const MaxLtAlgos = 32

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
	// kernels (Options.AttnKernels); by default it goes through cuBLAS.
	EnvAttention = "MESHRUN_CUDA_ATTENTION"
	// EnvBGrad set to "split" runs the bias gradient apart from the weight
	// gradient's GEMM (Options.BGradSplit), "fused" on its epilogue
	// (Options.BGradFused).
	EnvBGrad = "MESHRUN_BGRAD"
	// EnvLtAlgos is how many cuBLASLt candidates a GEMM's first call times,
	// 1 to MaxLtAlgos (Options.LtAlgos).
	EnvLtAlgos = "MESHRUN_CUBLASLT_ALGOS"
)

// OptionsFrom reads the options from getenv: MESHRUN_CUDA_SYNC=1,
// MESHRUN_TF32=1, MESHRUN_CUBLASLT=0, MESHRUN_CUDA_ATTENTION=kernels,
// MESHRUN_BGRAD=split|fused, MESHRUN_CUBLASLT_ALGOS=N (any other value, or none,
// leaves the default).
func OptionsFrom(getenv func(string) string) Options {
	algos, err := strconv.Atoi(getenv(EnvLtAlgos))
	if err != nil || algos < 1 || algos > MaxLtAlgos {
		algos = 0
	}
	return Options{
		LtAlgos:     algos,
		Sync:        getenv(EnvSync) == "1",
		TF32:        getenv(EnvTF32) == "1",
		NoLt:        getenv(EnvLt) == "0",
		AttnKernels: getenv(EnvAttention) == "kernels",
		BGradSplit:  getenv(EnvBGrad) == "split",
		BGradFused:  getenv(EnvBGrad) == "fused",
	}
}
