// Package cpu is the "cpu" kernels provider: pure Go plus Go assembly, no cgo.
//
// GEMMs run a BLIS-style loop nest over panels packed to the cache sizes, with a
// register-blocked micro-kernel chosen at start-up from the CPU's features
// (AVX-512: 8×48 float32 / 8×24 float64 tiles in zmm registers; AVX2+FMA: 6×16 /
// 6×8 in ymm registers; otherwise, with the noasm build tag, or on other
// architectures, a portable Go 4×4 kernel). Work is split over GOMAXPROCS
// goroutines by output tiles only, never over K, so results are bit-identical
// whatever the thread count. Pack buffers and job descriptors are pooled: calls
// do not allocate in the steady state.
package cpu

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// Name is the name the provider registers under.
const Name = "cpu"

// Options configures a Provider. The zero value is the default.
type Options struct {
	// Threads caps the goroutines per call; 0 means runtime.GOMAXPROCS(0) at call time.
	Threads int
	// Kernel forces a micro-kernel ("avx512", "avx2", "go"; see Kernels); "" picks
	// the best one this CPU runs. "go" also selects the portable bfloat16 path
	// unless BF16 says otherwise.
	Kernel string
	// BF16 forces the bfloat16 path ("avx512bf16", "avx512", "go"; see
	// BF16Kernels); "" picks the best one this CPU runs.
	BF16 string
	// Block overrides the float32 cache blocking (zero fields keep the kernel's
	// defaults). For tuning; results do not depend on MC and NC, only on KC.
	Block Blocking
	// BF16Block is Block for the bfloat16 GEMMs (KC in k values, even).
	BF16Block Blocking
}

// Blocking is the cache blocking of the GEMM loop nest: MC rows of A and KC of K
// per packed A block, NC columns of B per packed B block.
type Blocking struct{ MC, KC, NC int }

// Provider implements kernels.Provider on host tensors.
type Provider struct {
	threads int
	e32     engine[float32]
	e64     engine[float64]
	e16     engine16
}

var _ kernels.MemoryProvider = (*Provider)(nil)

var (
	jobPool32 = sync.Pool{New: func() any { return new(gemmJob[float32]) }}
	jobPool64 = sync.Pool{New: func() any { return new(gemmJob[float64]) }}
	bufPool32 freeList[packBuf[float32]]
	bufPool64 freeList[packBuf[float64]]
)

// Kernels returns the micro-kernels this machine can run, best first.
func Kernels() []string {
	var names []string
	for _, k := range kernels32 {
		names = append(names, k.name)
	}
	return names
}

// New returns a provider.
func New(o Options) (*Provider, error) {
	if o.Threads < 0 {
		return nil, fmt.Errorf("cpu: Threads = %d", o.Threads)
	}
	p := &Provider{threads: o.Threads}
	p.e32 = engine[float32]{dot: dot32, axpy: axpy32, jobs: &jobPool32, bufs: &bufPool32, gemvs: &gemvPool32, scratch: &gemvScratch32, gelu: gelu32s}
	p.e64 = engine[float64]{dot: dotGo[float64], axpy: axpyGo[float64], jobs: &jobPool64, bufs: &bufPool64, gemvs: &gemvPool64, scratch: &gemvScratch64, gelu: gelu64s}
	p.e32.uk, p.e64.uk = kernels32[0], kernels64[0]
	if len(kernels32) > 1 && kernels32[1].name == "avx512x12" {
		p.e32.ukTransA = kernels32[1]
	}
	if o.Kernel != "" {
		p.e32.ukTransA = nil
		p.e32.uk, p.e64.uk = nil, nil
		for i, k := range kernels32 {
			if k.name == o.Kernel {
				p.e32.uk, p.e64.uk = k, kernels64[i]
			}
		}
		if p.e32.uk == nil {
			return nil, fmt.Errorf("cpu: kernel %q not available here (have %v)", o.Kernel, Kernels())
		}
		if o.Kernel == "go" {
			p.e32.dot, p.e32.axpy = dotGo[float32], axpyGo[float32]
		}
	}
	p.e16.p = bf16Paths[0]
	bname := o.BF16
	if bname == "" && o.Kernel == "go" {
		bname = "go"
	}
	if bname != "" {
		bp, err := findPath16(bname)
		if err != nil {
			return nil, err
		}
		p.e16.p = bp
	}
	if o.BF16Block != (Blocking{}) {
		bp := *p.e16.p
		uk := *bp.uk
		if err := override(&uk.mc, &uk.kc, &uk.nc, o.BF16Block); err != nil {
			return nil, err
		}
		if uk.kc%2 != 0 {
			return nil, fmt.Errorf("cpu: bfloat16 KC = %d is odd", uk.kc)
		}
		bp.uk = &uk
		p.e16.p = &bp
	}
	if o.Block != (Blocking{}) {
		uk := *p.e32.uk
		for _, v := range []struct {
			dst *int
			src int
		}{{&uk.mc, o.Block.MC}, {&uk.kc, o.Block.KC}, {&uk.nc, o.Block.NC}} {
			if v.src < 0 {
				return nil, fmt.Errorf("cpu: negative blocking %+v", o.Block)
			}
			if v.src > 0 {
				*v.dst = v.src
			}
		}
		p.e32.uk = &uk
		p.e32.ukTransA = nil
	}
	return p, nil
}

// override sets the non-zero fields of b.
func override(mc, kc, nc *int, b Blocking) error {
	for _, v := range []struct {
		dst *int
		src int
	}{{mc, b.MC}, {kc, b.KC}, {nc, b.NC}} {
		if v.src < 0 {
			return fmt.Errorf("cpu: negative blocking %+v", b)
		}
		if v.src > 0 {
			*v.dst = v.src
		}
	}
	return nil
}

// Kernel returns the name of the micro-kernel in use.
func (p *Provider) Kernel() string { return p.e32.uk.name }

// BF16Kernel returns the name of the bfloat16 path in use.
func (p *Provider) BF16Kernel() string { return p.e16.p.name }

// BF16Blocking returns the bfloat16 cache blocking in use.
func (p *Provider) BF16Blocking() Blocking {
	uk := p.e16.p.uk
	return Blocking{MC: uk.mc, KC: uk.kc, NC: uk.nc}
}

// Blocking returns the float32 cache blocking in use.
func (p *Provider) Blocking() Blocking {
	return Blocking{MC: p.e32.uk.mc, KC: p.e32.uk.kc, NC: p.e32.uk.nc}
}

// Name implements kernels.Provider.
func (p *Provider) Name() string { return Name }

// Device implements kernels.Provider.
func (p *Provider) Device() tensor.DeviceKind { return tensor.CPU }

// Has implements kernels.Provider: the cpu provider implements every op.
func (p *Provider) Has(kernels.Op) bool { return true }

// DTypes implements kernels.Provider.
func (p *Provider) DTypes() []tensor.DType {
	return []tensor.DType{tensor.Float32, tensor.Float64, tensor.BFloat16}
}

// Memory implements kernels.MemoryProvider: host memory.
func (p *Provider) Memory() tensor.Memory { return tensor.Host }

func (p *Provider) nthreads() int {
	if p.threads > 0 {
		return p.threads
	}
	return runtime.GOMAXPROCS(0)
}

// Sgemm runs a float32 GEMM on host slices.
func (p *Provider) Sgemm(g kernels.GemmParams, a, b, c []float32) error {
	g.DType = tensor.Float32
	return runGemm(&p.e32, p.nthreads(), g, a, b, c)
}

// Dgemm runs a float64 GEMM on host slices.
func (p *Provider) Dgemm(g kernels.GemmParams, a, b, c []float64) error {
	g.DType = tensor.Float64
	return runGemm(&p.e64, p.nthreads(), g, a, b, c)
}

func runGemm[T float](e *engine[T], threads int, g kernels.GemmParams, a, b, c []T) error {
	g = g.Normalized()
	if err := g.Validate(); err != nil {
		return err
	}
	la, lb, lc := g.Lens()
	if len(a) < la || len(b) < lb || len(c) < lc {
		return fmt.Errorf("%w: gemm needs A>=%d B>=%d C>=%d elements, have %d/%d/%d",
			kernels.ErrShape, la, lb, lc, len(a), len(b), len(c))
	}
	args := gemmArgs[T]{transA: g.TransA, transB: g.TransB, m: g.M, n: g.N, k: g.K,
		alpha: T(g.Alpha), beta: T(g.Beta), lda: g.LDA, ldb: g.LDB, ldc: g.LDC}
	for i := 0; i < g.BatchCount; i++ {
		args.a, args.b, args.c = a[min(i*g.StrideA, len(a)):], b[min(i*g.StrideB, len(b)):], c[min(i*g.StrideC, len(c)):]
		e.gemm(args, threads)
	}
	return nil
}
