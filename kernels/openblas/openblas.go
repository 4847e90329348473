//go:build openblas

package openblas

/*
#cgo LDFLAGS: -lopenblas
#include <cblas.h>
*/
import "C"

import (
	"fmt"
	"runtime"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// Name is the name the provider registers under.
const Name = "openblas"

// Provider implements the GEMM-shaped kernels.Provider ops with OpenBLAS.
type Provider struct {
	kernels.NoTransformer // the transformer ops go to the cpu provider
}

var _ kernels.Provider = (*Provider)(nil)

// New returns a provider and sets OpenBLAS's (process-wide) thread count:
// threads <= 0 means GOMAXPROCS.
func New(threads int) (*Provider, error) {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	C.openblas_set_num_threads(C.int(threads))
	return &Provider{NoTransformer: kernels.NoTransformer{Name: Name}}, nil
}

// Config returns OpenBLAS's build configuration and the core it selected.
func Config() string {
	return fmt.Sprintf("%s (core %s)", C.GoString(C.openblas_get_config()), C.GoString(C.openblas_get_corename()))
}

// Name implements kernels.Provider.
func (p *Provider) Name() string { return Name }

// Device implements kernels.Provider.
func (p *Provider) Device() tensor.DeviceKind { return tensor.CPU }

// Has implements kernels.Provider: GEMM (plain and with the bias epilogue) and
// GEMV; the other epilogues and the elementwise ops go to the cpu provider.
func (p *Provider) Has(op kernels.Op) bool {
	return op == kernels.OpGemm || op == kernels.OpGemmBias || op == kernels.OpGemv
}

func trans(t bool) C.enum_CBLAS_TRANSPOSE {
	if t {
		return C.CblasTrans
	}
	return C.CblasNoTrans
}

// gemm runs a checked GEMM on host tensors; M = 1 takes GEMV (OpenBLAS's GEMM
// is slow on a single row).
func gemm(g kernels.GemmParams, a, b, c *tensor.Tensor) {
	if g.M == 0 || g.N == 0 {
		return
	}
	if g.M == 1 && g.K > 0 && !g.TransA {
		// c[0,:] = alpha·op(B)ᵀ·a[0,:] + beta·c[0,:]; B is N×K (TransB) or K×N.
		rows, cols := g.K, g.N
		tr := C.enum_CBLAS_TRANSPOSE(C.CblasTrans)
		if g.TransB {
			rows, cols, tr = g.N, g.K, C.CblasNoTrans
		}
		for i := 0; i < g.BatchCount; i++ {
			if g.DType == tensor.Float32 {
				C.cblas_sgemv(C.CblasRowMajor, tr, C.blasint(rows), C.blasint(cols), C.float(g.Alpha),
					(*C.float)(&b.Float32()[i*g.StrideB]), C.blasint(g.LDB), (*C.float)(&a.Float32()[i*g.StrideA]), 1,
					C.float(g.Beta), (*C.float)(&c.Float32()[i*g.StrideC]), 1)
			} else {
				C.cblas_dgemv(C.CblasRowMajor, tr, C.blasint(rows), C.blasint(cols), C.double(g.Alpha),
					(*C.double)(&b.Float64()[i*g.StrideB]), C.blasint(g.LDB), (*C.double)(&a.Float64()[i*g.StrideA]), 1,
					C.double(g.Beta), (*C.double)(&c.Float64()[i*g.StrideC]), 1)
			}
		}
		return
	}
	for i := 0; i < g.BatchCount; i++ {
		if g.DType == tensor.Float32 {
			av, bv, cv := a.Float32(), b.Float32(), c.Float32()
			var ap, bp *C.float
			if g.K > 0 {
				ap, bp = (*C.float)(&av[i*g.StrideA]), (*C.float)(&bv[i*g.StrideB])
			}
			C.cblas_sgemm(C.CblasRowMajor, trans(g.TransA), trans(g.TransB), C.blasint(g.M), C.blasint(g.N), C.blasint(g.K),
				C.float(g.Alpha), ap, C.blasint(g.LDA), bp, C.blasint(g.LDB), C.float(g.Beta), (*C.float)(&cv[i*g.StrideC]), C.blasint(g.LDC))
		} else {
			av, bv, cv := a.Float64(), b.Float64(), c.Float64()
			var ap, bp *C.double
			if g.K > 0 {
				ap, bp = (*C.double)(&av[i*g.StrideA]), (*C.double)(&bv[i*g.StrideB])
			}
			C.cblas_dgemm(C.CblasRowMajor, trans(g.TransA), trans(g.TransB), C.blasint(g.M), C.blasint(g.N), C.blasint(g.K),
				C.double(g.Alpha), ap, C.blasint(g.LDA), bp, C.blasint(g.LDB), C.double(g.Beta), (*C.double)(&cv[i*g.StrideC]), C.blasint(g.LDC))
		}
	}
}

// GroupedGemm implements kernels.Kernels: not here (Has is false); the
// Dispatcher sends it to the cpu provider.
func (p *Provider) GroupedGemm(kernels.GroupedParams, kernels.GemmOperands) error {
	return unsupported(kernels.OpGroupedGemm)
}

func host(ts ...*tensor.Tensor) error { return kernels.SameDevice(tensor.CPU, ts...) }

// Gemm implements kernels.Kernels for no epilogue and the bias epilogue (the
// rows of C are set to beta·C + bias, then one GEMM with beta = 1).
func (p *Provider) Gemm(g kernels.GemmParams, o kernels.GemmOperands) error {
	if err := host(o.A, o.B, o.C, o.Bias); err != nil {
		return err
	}
	g, err := kernels.CheckGemm(g, o)
	if err != nil {
		return err
	}
	if g.Epilogue != kernels.EpilogueNone && g.Epilogue != kernels.EpilogueBias {
		return unsupported(g.Epilogue.Op())
	}
	if empty, err := kernels.EmptyGemm(p, tensor.Host, g, o); empty {
		return err
	}
	if g.Epilogue == kernels.EpilogueBias {
		if g.DType == tensor.Float32 {
			broadcast(o.C.Float32(), g.LDC, o.Bias.Float32(), g.M, g.N, float32(g.Beta))
		} else {
			broadcast(o.C.Float64(), g.LDC, o.Bias.Float64(), g.M, g.N, g.Beta)
		}
		g.Beta = 1
	}
	gemm(g, o.A, o.B, o.C)
	return nil
}

// broadcast sets each row of c[m, ldc] to beta·c + b (b without reading c when
// beta is 0).
func broadcast[T float32 | float64](c []T, ldc int, b []T, m, n int, beta T) {
	for i := 0; i < m; i++ {
		row := c[i*ldc:][:n]
		for j := range row {
			if beta == 0 {
				row[j] = b[j]
			} else {
				row[j] = beta*row[j] + b[j]
			}
		}
	}
}

// Gemv implements kernels.Kernels.
func (p *Provider) Gemv(g kernels.GemvParams, a, x, y *tensor.Tensor) error {
	if err := host(a, x, y); err != nil {
		return err
	}
	g, err := kernels.CheckGemv(g, a, x, y)
	if err != nil {
		return err
	}
	_, lx, ly := g.Lens()
	if ly == 0 {
		return nil
	}
	if lx == 0 {
		// OpenBLAS scales y by beta; with beta = 0 it must not read y.
		if g.DType == tensor.Float32 {
			scale(y.Float32()[:ly], float32(g.Beta))
		} else {
			scale(y.Float64()[:ly], g.Beta)
		}
		return nil
	}
	if g.DType == tensor.Float32 {
		C.cblas_sgemv(C.CblasRowMajor, trans(g.Trans), C.blasint(g.M), C.blasint(g.N), C.float(g.Alpha),
			(*C.float)(&a.Float32()[0]), C.blasint(g.LDA), (*C.float)(&x.Float32()[0]), 1, C.float(g.Beta), (*C.float)(&y.Float32()[0]), 1)
	} else {
		C.cblas_dgemv(C.CblasRowMajor, trans(g.Trans), C.blasint(g.M), C.blasint(g.N), C.double(g.Alpha),
			(*C.double)(&a.Float64()[0]), C.blasint(g.LDA), (*C.double)(&x.Float64()[0]), 1, C.double(g.Beta), (*C.double)(&y.Float64()[0]), 1)
	}
	return nil
}

func scale[T float32 | float64](y []T, beta T) {
	for i := range y {
		if beta == 0 {
			y[i] = 0
		} else {
			y[i] *= beta
		}
	}
}

// GeluForward is not implemented (Has reports false).
func (p *Provider) GeluForward(y, x *tensor.Tensor) error { return unsupported(kernels.OpGeluForward) }

// GeluBackward is not implemented (Has reports false).
func (p *Provider) GeluBackward(dx, dy, x *tensor.Tensor) error {
	return unsupported(kernels.OpGeluBackward)
}

// BiasGrad is not implemented (Has reports false).
func (p *Provider) BiasGrad(db, dy *tensor.Tensor, accumulate bool) error {
	return unsupported(kernels.OpBiasGrad)
}

// Axpy is not implemented (Has reports false).
func (p *Provider) Axpy(alpha float64, x, y *tensor.Tensor) error { return unsupported(kernels.OpAxpy) }

// DTypes implements kernels.Provider: OpenBLAS's GEMMs are float32 and float64
// (Debian's 0.3.21 declares cblas_sbgemm but does not export it).
func (p *Provider) DTypes() []tensor.DType { return []tensor.DType{tensor.Float32, tensor.Float64} }

// Cast is not implemented (Has reports false).
func (p *Provider) Cast(dst, src *tensor.Tensor) error { return unsupported(kernels.OpCast) }

// MSE is not implemented (Has reports false).
func (p *Provider) MSE(dy, sum, y, target *tensor.Tensor, scale float64) error {
	return unsupported(kernels.OpMSE)
}

func unsupported(op kernels.Op) error {
	return fmt.Errorf("%w: openblas %v", kernels.ErrUnsupported, op)
}
