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
	// the best one this CPU runs.
	Kernel string
	// Block overrides the float32 cache blocking (zero fields keep the kernel's
	// defaults). For tuning; results do not depend on MC and NC, only on KC.
	Block Blocking
}

// Blocking is the cache blocking of the GEMM loop nest: MC rows of A and KC of K
// per packed A block, NC columns of B per packed B block.
type Blocking struct{ MC, KC, NC int }

// Provider implements kernels.Provider on host tensors.
type Provider struct {
	threads int
	e32     engine[float32]
	e64     engine[float64]
}

var _ kernels.Provider = (*Provider)(nil)

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
	p.e32 = engine[float32]{dot: dot32, axpy: axpy32, jobs: &jobPool32, bufs: &bufPool32, gemvs: &gemvPool32, scratch: &gemvScratch32}
	p.e64 = engine[float64]{dot: dotGo[float64], axpy: axpyGo[float64], jobs: &jobPool64, bufs: &bufPool64, gemvs: &gemvPool64, scratch: &gemvScratch64}
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

// Kernel returns the name of the micro-kernel in use.
func (p *Provider) Kernel() string { return p.e32.uk.name }

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

func (p *Provider) host(ts ...*tensor.Tensor) error {
	return kernels.SameDevice(tensor.CPU, ts...)
}

// gemmT runs g on tensors (already checked).
func (p *Provider) gemmT(g kernels.GemmParams, a, b, c *tensor.Tensor) error {
	if g.DType == tensor.Float32 {
		return p.Sgemm(g, a.Float32(), b.Float32(), c.Float32())
	}
	return p.Dgemm(g, a.Float64(), b.Float64(), c.Float64())
}

// Gemm implements kernels.Kernels.
func (p *Provider) Gemm(g kernels.GemmParams, a, b, c *tensor.Tensor) error {
	if err := p.host(a, b, c); err != nil {
		return err
	}
	g, err := kernels.CheckGemm(g, a, b, c)
	if err != nil {
		return err
	}
	return p.gemmT(g, a, b, c)
}

// Gemv implements kernels.Kernels.
func (p *Provider) Gemv(g kernels.GemvParams, a, x, y *tensor.Tensor) error {
	if err := p.host(a, x, y); err != nil {
		return err
	}
	g, err := kernels.CheckGemv(g, a, x, y)
	if err != nil {
		return err
	}
	t := p.nthreads()
	if g.DType == tensor.Float32 {
		p.e32.gemv(g.Trans, g.M, g.N, a.Float32(), g.LDA, x.Float32(), y.Float32(), float32(g.Alpha), float32(g.Beta), t)
	} else {
		p.e64.gemv(g.Trans, g.M, g.N, a.Float64(), g.LDA, x.Float64(), y.Float64(), g.Alpha, g.Beta, t)
	}
	return nil
}

// LinearForward implements kernels.Kernels: y starts as the broadcast bias and
// the GEMM adds x·wᵀ to it (beta = 1); without a bias beta = 0.
func (p *Provider) LinearForward(y, x, w, b *tensor.Tensor) error {
	if err := p.host(y, x, w, b); err != nil {
		return err
	}
	m, n, k, err := kernels.LinearDims(y, x, w, b)
	if err != nil {
		return err
	}
	if b != nil && k > 0 && m > 1 && y.DType() == tensor.Float32 && p.e32.uk.biasFn != nil {
		// Fused: the micro-kernel writes x·wᵀ + b, y is never read.
		p.e32.gemm(gemmArgs[float32]{transB: true, m: m, n: n, k: k, alpha: 1, a: x.Float32(), b: w.Float32(),
			c: y.Float32(), lda: k, ldb: k, ldc: n, bias: b.Float32()}, p.nthreads())
		return nil
	}
	if b != nil {
		if y.DType() == tensor.Float32 {
			broadcastRows(y.Float32(), b.Float32(), m, n)
		} else {
			broadcastRows(y.Float64(), b.Float64(), m, n)
		}
	}
	g := kernels.LinearForwardGemm(m, n, k, b != nil, y.DType())
	return p.gemmT(g, x, w, y)
}

// LinearBackwardInput implements kernels.Kernels.
func (p *Provider) LinearBackwardInput(dx, dy, w *tensor.Tensor) error {
	if err := p.host(dx, dy, w); err != nil {
		return err
	}
	m, n, k, err := kernels.LinearDims(dy, dx, w, nil)
	if err != nil {
		return err
	}
	return p.gemmT(kernels.LinearBackwardInputGemm(m, n, k, dx.DType()), dy, w, dx)
}

// LinearBackwardWeight implements kernels.Kernels.
func (p *Provider) LinearBackwardWeight(dw, dy, x *tensor.Tensor, accumulate bool) error {
	if err := p.host(dw, dy, x); err != nil {
		return err
	}
	m, n, k, err := kernels.LinearDims(dy, x, dw, nil)
	if err != nil {
		return err
	}
	return p.gemmT(kernels.LinearBackwardWeightGemm(m, n, k, accumulate, dw.DType()), dy, x, dw)
}

// LinearBackwardBias implements kernels.Kernels.
func (p *Provider) LinearBackwardBias(db, dy *tensor.Tensor, accumulate bool) error {
	if err := p.host(db, dy); err != nil {
		return err
	}
	m, n, err := kernels.BiasDims(db, dy)
	if err != nil {
		return err
	}
	if db.DType() == tensor.Float32 {
		columnSum(db.Float32(), dy.Float32(), m, n, accumulate)
	} else {
		columnSum(db.Float64(), dy.Float64(), m, n, accumulate)
	}
	return nil
}

// MatmulForward implements kernels.Kernels.
func (p *Provider) MatmulForward(c, a, b *tensor.Tensor) error {
	if err := p.host(c, a, b); err != nil {
		return err
	}
	batch, m, n, k, err := kernels.MatmulDims(c, a, b)
	if err != nil {
		return err
	}
	return p.gemmT(kernels.MatmulForwardGemm(batch, m, n, k, c.DType()), a, b, c)
}

// MatmulBackwardInput implements kernels.Kernels.
func (p *Provider) MatmulBackwardInput(da, dc, b *tensor.Tensor, accumulate bool) error {
	if err := p.host(da, dc, b); err != nil {
		return err
	}
	batch, m, n, k, err := kernels.MatmulDims(dc, da, b)
	if err != nil {
		return err
	}
	return p.gemmT(kernels.MatmulBackwardInputGemm(batch, m, n, k, accumulate, da.DType()), dc, b, da)
}

// MatmulBackwardOther implements kernels.Kernels.
func (p *Provider) MatmulBackwardOther(db, dc, a *tensor.Tensor, accumulate bool) error {
	if err := p.host(db, dc, a); err != nil {
		return err
	}
	batch, m, n, k, err := kernels.MatmulDims(dc, a, db)
	if err != nil {
		return err
	}
	return p.gemmT(kernels.MatmulBackwardOtherGemm(batch, m, n, k, accumulate, db.DType()), a, dc, db)
}

// GeluForward implements kernels.Kernels.
func (p *Provider) GeluForward(y, x *tensor.Tensor) error {
	if err := p.host(y, x); err != nil {
		return err
	}
	if _, err := kernels.ElementwiseDims(y, x); err != nil {
		return err
	}
	if y.DType() == tensor.Float32 {
		gelu32s(y.Float32(), nil, x.Float32(), false, p.nthreads())
	} else {
		geluForward(y.Float64(), x.Float64())
	}
	return nil
}

// GeluBackward implements kernels.Kernels.
func (p *Provider) GeluBackward(dx, dy, x *tensor.Tensor) error {
	if err := p.host(dx, dy, x); err != nil {
		return err
	}
	if _, err := kernels.ElementwiseDims(dx, dy, x); err != nil {
		return err
	}
	if dx.DType() == tensor.Float32 {
		gelu32s(dx.Float32(), dy.Float32(), x.Float32(), true, p.nthreads())
	} else {
		geluBackward(dx.Float64(), dy.Float64(), x.Float64())
	}
	return nil
}
