package cpu

import (
	"fmt"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

func (p *Provider) host(ts ...*tensor.Tensor) error {
	return kernels.SameDevice(tensor.CPU, ts...)
}

// Gemm implements kernels.Kernels, every epilogue included.
func (p *Provider) Gemm(g kernels.GemmParams, o kernels.GemmOperands) error {
	if err := p.host(o.A, o.B, o.C, o.Bias, o.Aux); err != nil {
		return err
	}
	g, err := kernels.CheckGemm(g, o)
	if err != nil {
		return err
	}
	if empty, err := kernels.EmptyGemm(p, tensor.Host, g, o); empty {
		return err
	}
	p.gemm(g, o, p.nthreads())
	return nil
}

// gemm runs a checked GEMM with no empty dimension on up to t goroutines.
func (p *Provider) gemm(g kernels.GemmParams, o kernels.GemmOperands, t int) {
	if g.DType == tensor.BFloat16 {
		p.gemm16(g, o, t)
	} else if g.DType == tensor.Float32 {
		gemmEpilogue(&p.e32, t, g, o.A.Float32(), o.B.Float32(), o.C.Float32(), f32(o.Bias), f32(o.Aux))
	} else {
		gemmEpilogue(&p.e64, t, g, o.A.Float64(), o.B.Float64(), o.C.Float64(), f64(o.Bias), f64(o.Aux))
	}
}

func f32(t *tensor.Tensor) []float32 {
	if t == nil {
		return nil
	}
	return t.Float32()
}

func f64(t *tensor.Tensor) []float64 {
	if t == nil {
		return nil
	}
	return t.Float64()
}

// gemmEpilogue runs a checked GEMM and its epilogue. The bias epilogue is fused
// into the micro-kernel where it has one (float32 AVX-512, beta = 0); the other
// epilogues are a pass over the tile rows after the GEMM.
func gemmEpilogue[T float](e *engine[T], threads int, g kernels.GemmParams, a, b, c, bias, aux []T) {
	m, n := g.M, g.N
	args := gemmArgs[T]{transA: g.TransA, transB: g.TransB, m: m, n: n, k: g.K,
		alpha: T(g.Alpha), beta: T(g.Beta), lda: g.LDA, ldb: g.LDB, ldc: g.LDC}
	if g.Epilogue == kernels.EpilogueNone {
		for i := 0; i < g.BatchCount; i++ {
			args.a, args.b, args.c = a[min(i*g.StrideA, len(a)):], b[min(i*g.StrideB, len(b)):], c[min(i*g.StrideC, len(c)):]
			e.gemm(args, threads)
		}
		return
	}
	args.a, args.b, args.c = a, b, c
	switch g.Epilogue {
	case kernels.EpilogueBias:
		gemmBias(e, threads, args, bias)
	case kernels.EpilogueBiasGelu:
		// The pre-activation goes to aux (tight rows), then C = gelu(aux).
		if g.Beta != 0 {
			for i := 0; i < m; i++ {
				copy(aux[i*n:][:n], c[i*g.LDC:][:n])
			}
		}
		pre := args
		pre.c, pre.ldc = aux, n
		gemmBias(e, threads, pre, bias)
		rowBlocks(c, g.LDC, aux, m, n, func(c, aux []T) { e.gelu(c, nil, aux, false, threads) })
	case kernels.EpilogueDGelu, kernels.EpilogueDGeluBGrad:
		e.gemm(args, threads)
		rowBlocks(c, g.LDC, aux, m, n, func(c, aux []T) { e.gelu(c, c, aux, true, threads) })
		if g.Epilogue == kernels.EpilogueDGeluBGrad {
			columnSum(bias, c, m, n, g.LDC, false)
		}
	case kernels.EpilogueBGrad:
		e.gemm(args, threads)
		if g.TransA { // A is K rows of M: op(A)'s row sums are A's column sums
			columnSum(bias, a, g.K, m, g.LDA, false)
		} else {
			rowSum(bias, a, m, g.K, g.LDA)
		}
	default:
		panic(fmt.Sprintf("cpu: unchecked epilogue %v", g.Epilogue))
	}
}

// rowBlocks calls f on the rows of c[m, ldc] and of aux[m, n] alike: once for
// all rows when c is tight, else row by row.
func rowBlocks[T float](c []T, ldc int, aux []T, m, n int, f func(c, aux []T)) {
	if m == 0 || n == 0 {
		return
	}
	if ldc == n {
		f(c[:m*n], aux[:m*n])
		return
	}
	for i := 0; i < m; i++ {
		f(c[i*ldc:][:n], aux[i*n:][:n])
	}
}

// gemmBias computes c = alpha·op(a)·op(b) + beta·c + bias, bias broadcast over
// rows: in the micro-kernel when it has a fused bias and beta is 0, else by
// setting c to beta·c + bias and running the GEMM with beta = 1.
func gemmBias[T float](e *engine[T], threads int, g gemmArgs[T], bias []T) {
	if g.m == 0 || g.n == 0 {
		return
	}
	if g.beta == 0 && g.k > 0 && g.m > 1 && g.alpha != 0 && e.uk.biasFn != nil {
		g.bias = bias
		e.gemm(g, threads)
		return
	}
	broadcastRows(g.c, g.ldc, bias, g.m, g.n, g.beta)
	g.beta = 1
	e.gemm(g, threads)
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

// GeluForward implements kernels.Kernels.
func (p *Provider) GeluForward(y, x *tensor.Tensor) error {
	if err := p.host(y, x); err != nil {
		return err
	}
	if _, err := kernels.ElementwiseDims(y, x); err != nil {
		return err
	}
	if y.DType() == tensor.BFloat16 {
		p.gelu16(y.BFloat16(), nil, x.BFloat16(), false)
	} else if y.DType() == tensor.Float32 {
		p.e32.gelu(y.Float32(), nil, x.Float32(), false, p.nthreads())
	} else {
		p.e64.gelu(y.Float64(), nil, x.Float64(), false, p.nthreads())
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
	if dx.DType() == tensor.BFloat16 {
		p.gelu16(dx.BFloat16(), dy.BFloat16(), x.BFloat16(), true)
	} else if dx.DType() == tensor.Float32 {
		p.e32.gelu(dx.Float32(), dy.Float32(), x.Float32(), true, p.nthreads())
	} else {
		p.e64.gelu(dx.Float64(), dy.Float64(), x.Float64(), true, p.nthreads())
	}
	return nil
}

// BiasGrad implements kernels.Kernels.
func (p *Provider) BiasGrad(db, dy *tensor.Tensor, accumulate bool) error {
	if err := p.host(db, dy); err != nil {
		return err
	}
	m, n, err := kernels.BiasDims(db, dy)
	if err != nil {
		return err
	}
	if dy.DType() == tensor.BFloat16 {
		p.biasGrad16(matOf(db, 0), dy.BFloat16(), m, n, accumulate)
	} else if db.DType() == tensor.Float32 {
		columnSum(db.Float32(), dy.Float32(), m, n, n, accumulate)
	} else {
		columnSum(db.Float64(), dy.Float64(), m, n, n, accumulate)
	}
	return nil
}

// Axpy implements kernels.Kernels.
func (p *Provider) Axpy(alpha float64, x, y *tensor.Tensor) error {
	if err := p.host(x, y); err != nil {
		return err
	}
	if _, err := kernels.ElementwiseDims(y, x); err != nil {
		return err
	}
	if y.DType() == tensor.BFloat16 {
		p.axpy16(float32(alpha), x.BFloat16(), y.BFloat16())
	} else if y.DType() == tensor.Float32 {
		axpy(float32(alpha), x.Float32(), y.Float32(), p.nthreads())
	} else {
		axpy(alpha, x.Float64(), y.Float64(), p.nthreads())
	}
	return nil
}

// MSE implements kernels.Kernels.
func (p *Provider) MSE(dy, sum, y, target *tensor.Tensor, scale float64) error {
	if err := p.host(dy, sum, y, target); err != nil {
		return err
	}
	if err := kernels.MSEDims(dy, sum, y, target); err != nil {
		return err
	}
	if y.DType() == tensor.BFloat16 {
		sum.Float64()[0] = p.mse16(dy.BFloat16(), y.BFloat16(), target.BFloat16(), float32(scale))
	} else if y.DType() == tensor.Float32 {
		sum.Float64()[0] = mse(dy.Float32(), y.Float32(), target.Float32(), float32(scale), p.nthreads())
	} else {
		sum.Float64()[0] = mse(dy.Float64(), y.Float64(), target.Float64(), scale, p.nthreads())
	}
	return nil
}

// Cast implements kernels.Kernels.
func (p *Provider) Cast(dst, src *tensor.Tensor) error {
	if err := p.host(dst, src); err != nil {
		return err
	}
	n, err := kernels.CastDims(dst, src)
	if err != nil {
		return err
	}
	switch {
	case dst.DType() == src.DType():
		copy(tensor.HostBytes(dst), tensor.HostBytes(src))
	case dst.DType() == tensor.BFloat16 && src.DType() == tensor.Float32:
		p.ew16(ewCastTo16, n, ewArgs{y: dst.BFloat16(), f: src.Float32()})
	case dst.DType() == tensor.Float32 && src.DType() == tensor.BFloat16:
		p.ew16(ewCastTo32, n, ewArgs{x: src.BFloat16(), f: dst.Float32()})
	default:
		for i := 0; i < n; i++ {
			setFloat(dst, i, src.At(i))
		}
	}
	return nil
}

// setFloat sets element i of a host tensor from a float64 (rounded once).
func setFloat(t *tensor.Tensor, i int, v float64) {
	switch t.DType() {
	case tensor.Float32:
		t.Float32()[i] = float32(v)
	case tensor.Float64:
		t.Float64()[i] = v
	case tensor.BFloat16:
		t.BFloat16()[i] = tensor.ToBF16(float32(v))
	}
}
