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
type Provider struct{}

var _ kernels.Provider = (*Provider)(nil)

// New returns a provider and sets OpenBLAS's (process-wide) thread count:
// threads <= 0 means GOMAXPROCS.
func New(threads int) (*Provider, error) {
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	C.openblas_set_num_threads(C.int(threads))
	return &Provider{}, nil
}

// Config returns OpenBLAS's build configuration and the core it selected.
func Config() string {
	return fmt.Sprintf("%s (core %s)", C.GoString(C.openblas_get_config()), C.GoString(C.openblas_get_corename()))
}

// Name implements kernels.Provider.
func (p *Provider) Name() string { return Name }

// Device implements kernels.Provider.
func (p *Provider) Device() tensor.DeviceKind { return tensor.CPU }

// Has implements kernels.Provider.
func (p *Provider) Has(op kernels.Op) bool {
	switch op {
	case kernels.OpLinearBackwardBias, kernels.OpGeluForward, kernels.OpGeluBackward:
		return false
	}
	return true
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

func host(ts ...*tensor.Tensor) error { return kernels.SameDevice(tensor.CPU, ts...) }

// Gemm implements kernels.Kernels.
func (p *Provider) Gemm(g kernels.GemmParams, a, b, c *tensor.Tensor) error {
	if err := host(a, b, c); err != nil {
		return err
	}
	g, err := kernels.CheckGemm(g, a, b, c)
	if err != nil {
		return err
	}
	gemm(g, a, b, c)
	return nil
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

// LinearForward implements kernels.Kernels: the rows of y are set to the bias,
// then one GEMM with beta = 1.
func (p *Provider) LinearForward(y, x, w, b *tensor.Tensor) error {
	if err := host(y, x, w, b); err != nil {
		return err
	}
	m, n, k, err := kernels.LinearDims(y, x, w, b)
	if err != nil {
		return err
	}
	if b != nil {
		for i := 0; i < m; i++ {
			if y.DType() == tensor.Float32 {
				copy(y.Float32()[i*n:(i+1)*n], b.Float32())
			} else {
				copy(y.Float64()[i*n:(i+1)*n], b.Float64())
			}
		}
	}
	gemm(kernels.LinearForwardGemm(m, n, k, b != nil, y.DType()), x, w, y)
	return nil
}

// LinearBackwardInput implements kernels.Kernels.
func (p *Provider) LinearBackwardInput(dx, dy, w *tensor.Tensor) error {
	if err := host(dx, dy, w); err != nil {
		return err
	}
	m, n, k, err := kernels.LinearDims(dy, dx, w, nil)
	if err != nil {
		return err
	}
	gemm(kernels.LinearBackwardInputGemm(m, n, k, dx.DType()), dy, w, dx)
	return nil
}

// LinearBackwardWeight implements kernels.Kernels.
func (p *Provider) LinearBackwardWeight(dw, dy, x *tensor.Tensor, accumulate bool) error {
	if err := host(dw, dy, x); err != nil {
		return err
	}
	m, n, k, err := kernels.LinearDims(dy, x, dw, nil)
	if err != nil {
		return err
	}
	gemm(kernels.LinearBackwardWeightGemm(m, n, k, accumulate, dw.DType()), dy, x, dw)
	return nil
}

// MatmulForward implements kernels.Kernels.
func (p *Provider) MatmulForward(c, a, b *tensor.Tensor) error {
	if err := host(c, a, b); err != nil {
		return err
	}
	batch, m, n, k, err := kernels.MatmulDims(c, a, b)
	if err != nil {
		return err
	}
	gemm(kernels.MatmulForwardGemm(batch, m, n, k, c.DType()), a, b, c)
	return nil
}

// MatmulBackwardInput implements kernels.Kernels.
func (p *Provider) MatmulBackwardInput(da, dc, b *tensor.Tensor, accumulate bool) error {
	if err := host(da, dc, b); err != nil {
		return err
	}
	batch, m, n, k, err := kernels.MatmulDims(dc, da, b)
	if err != nil {
		return err
	}
	gemm(kernels.MatmulBackwardInputGemm(batch, m, n, k, accumulate, da.DType()), dc, b, da)
	return nil
}

// MatmulBackwardOther implements kernels.Kernels.
func (p *Provider) MatmulBackwardOther(db, dc, a *tensor.Tensor, accumulate bool) error {
	if err := host(db, dc, a); err != nil {
		return err
	}
	batch, m, n, k, err := kernels.MatmulDims(dc, a, db)
	if err != nil {
		return err
	}
	gemm(kernels.MatmulBackwardOtherGemm(batch, m, n, k, accumulate, db.DType()), a, dc, db)
	return nil
}

// LinearBackwardBias is not implemented (Has reports false).
func (p *Provider) LinearBackwardBias(db, dy *tensor.Tensor, accumulate bool) error {
	return fmt.Errorf("%w: openblas linear_backward_bias", kernels.ErrUnsupported)
}

// GeluForward is not implemented (Has reports false).
func (p *Provider) GeluForward(y, x *tensor.Tensor) error {
	return fmt.Errorf("%w: openblas gelu_forward", kernels.ErrUnsupported)
}

// GeluBackward is not implemented (Has reports false).
func (p *Provider) GeluBackward(dx, dy, x *tensor.Tensor) error {
	return fmt.Errorf("%w: openblas gelu_backward", kernels.ErrUnsupported)
}
