//go:build cuda

package cuda

import (
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// Gemm implements kernels.Kernels.
func (p *Provider) Gemm(g kernels.GemmParams, a, b, c *tensor.Tensor) error {
	if err := p.onDevice(a, b, c); err != nil {
		return err
	}
	g, err := kernels.CheckGemm(g, a, b, c)
	if err != nil {
		return err
	}
	return p.do(func() error { return p.gemm(g, a, b, c) })
}

// Gemv implements kernels.Kernels.
func (p *Provider) Gemv(g kernels.GemvParams, a, x, y *tensor.Tensor) error {
	if err := p.onDevice(a, x, y); err != nil {
		return err
	}
	g, err := kernels.CheckGemv(g, a, x, y)
	if err != nil {
		return err
	}
	return p.do(func() error { return p.gemv(g, a, x, y) })
}

// LinearForward implements kernels.Kernels: y = ones[M]·b[N] (a K = 1 GEMM
// writes the broadcast bias), then y += x·wᵀ. M = 1 takes cublasSgemv.
func (p *Provider) LinearForward(y, x, w, b *tensor.Tensor) error {
	if err := p.onDevice(y, x, w, b); err != nil {
		return err
	}
	m, n, k, err := kernels.LinearDims(y, x, w, b)
	if err != nil {
		return err
	}
	dt := y.DType()
	return p.do(func() error {
		if m == 0 || n == 0 {
			return nil
		}
		if b != nil {
			ones, err := p.onesVec(dt, m)
			if err != nil {
				return err
			}
			bc := kernels.GemmParams{M: m, N: n, K: 1, Alpha: 1, DType: dt}.Normalized()
			if err := p.gemm(bc, ones, b, y); err != nil {
				return err
			}
		}
		if m == 1 {
			// y[N] = w[N,K]·x[K] (+ y)
			g := kernels.GemvParams{M: n, N: k, Alpha: 1, Beta: betaIf(b != nil), DType: dt}.Normalized()
			return p.gemv(g, w, x, y)
		}
		return p.gemm(kernels.LinearForwardGemm(m, n, k, b != nil, dt), x, w, y)
	})
}

func betaIf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// LinearBackwardInput implements kernels.Kernels; M = 1 takes cublasSgemv.
func (p *Provider) LinearBackwardInput(dx, dy, w *tensor.Tensor) error {
	if err := p.onDevice(dx, dy, w); err != nil {
		return err
	}
	m, n, k, err := kernels.LinearDims(dy, dx, w, nil)
	if err != nil {
		return err
	}
	dt := dx.DType()
	return p.do(func() error {
		if m == 1 {
			// dx[K] = w[N,K]ᵀ·dy[N]
			return p.gemv(kernels.GemvParams{Trans: true, M: n, N: k, Alpha: 1, DType: dt}.Normalized(), w, dy, dx)
		}
		return p.gemm(kernels.LinearBackwardInputGemm(m, n, k, dt), dy, w, dx)
	})
}

// LinearBackwardWeight implements kernels.Kernels.
func (p *Provider) LinearBackwardWeight(dw, dy, x *tensor.Tensor, accumulate bool) error {
	if err := p.onDevice(dw, dy, x); err != nil {
		return err
	}
	m, n, k, err := kernels.LinearDims(dy, x, dw, nil)
	if err != nil {
		return err
	}
	return p.do(func() error {
		return p.gemm(kernels.LinearBackwardWeightGemm(m, n, k, accumulate, dw.DType()), dy, x, dw)
	})
}

// LinearBackwardBias implements kernels.Kernels: db = dyᵀ·ones, a GEMV.
func (p *Provider) LinearBackwardBias(db, dy *tensor.Tensor, accumulate bool) error {
	if err := p.onDevice(db, dy); err != nil {
		return err
	}
	m, n, err := kernels.BiasDims(db, dy)
	if err != nil {
		return err
	}
	dt := db.DType()
	return p.do(func() error {
		ones, err := p.onesVec(dt, m)
		if err != nil {
			return err
		}
		g := kernels.GemvParams{Trans: true, M: m, N: n, Alpha: 1, Beta: betaIf(accumulate), DType: dt}.Normalized()
		return p.gemv(g, dy, ones, db)
	})
}

// MatmulForward implements kernels.Kernels.
func (p *Provider) MatmulForward(c, a, b *tensor.Tensor) error {
	if err := p.onDevice(c, a, b); err != nil {
		return err
	}
	batch, m, n, k, err := kernels.MatmulDims(c, a, b)
	if err != nil {
		return err
	}
	return p.do(func() error { return p.gemm(kernels.MatmulForwardGemm(batch, m, n, k, c.DType()), a, b, c) })
}

// MatmulBackwardInput implements kernels.Kernels.
func (p *Provider) MatmulBackwardInput(da, dc, b *tensor.Tensor, accumulate bool) error {
	if err := p.onDevice(da, dc, b); err != nil {
		return err
	}
	batch, m, n, k, err := kernels.MatmulDims(dc, da, b)
	if err != nil {
		return err
	}
	return p.do(func() error {
		return p.gemm(kernels.MatmulBackwardInputGemm(batch, m, n, k, accumulate, da.DType()), dc, b, da)
	})
}

// MatmulBackwardOther implements kernels.Kernels.
func (p *Provider) MatmulBackwardOther(db, dc, a *tensor.Tensor, accumulate bool) error {
	if err := p.onDevice(db, dc, a); err != nil {
		return err
	}
	batch, m, n, k, err := kernels.MatmulDims(dc, a, db)
	if err != nil {
		return err
	}
	return p.do(func() error {
		return p.gemm(kernels.MatmulBackwardOtherGemm(batch, m, n, k, accumulate, db.DType()), a, dc, db)
	})
}

// GeluForward implements kernels.Kernels. cuBLAS has no elementwise kernels, so
// this copies x to the host, runs the cpu provider and copies y back: correct,
// and slow; a device kernel is future work.
func (p *Provider) GeluForward(y, x *tensor.Tensor) error {
	if err := p.onDevice(y, x); err != nil {
		return err
	}
	if _, err := kernels.ElementwiseDims(y, x); err != nil {
		return err
	}
	hx, hy := tensor.New(x.DType(), x.Shape()...), tensor.New(y.DType(), y.Shape()...)
	if err := p.Download(hx, x); err != nil {
		return err
	}
	if err := p.host.GeluForward(hy, hx); err != nil {
		return err
	}
	return p.copyH2D(y, hy)
}

// GeluBackward implements kernels.Kernels, through the host like GeluForward.
func (p *Provider) GeluBackward(dx, dy, x *tensor.Tensor) error {
	if err := p.onDevice(dx, dy, x); err != nil {
		return err
	}
	if _, err := kernels.ElementwiseDims(dx, dy, x); err != nil {
		return err
	}
	hx, hdy, hdx := tensor.New(x.DType(), x.Shape()...), tensor.New(dy.DType(), dy.Shape()...), tensor.New(dx.DType(), dx.Shape()...)
	if err := p.Download(hx, x); err != nil {
		return err
	}
	if err := p.Download(hdy, dy); err != nil {
		return err
	}
	if err := p.host.GeluBackward(hdx, hdy, hx); err != nil {
		return err
	}
	return p.copyH2D(dx, hdx)
}
