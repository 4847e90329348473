//go:build cuda

package cuda

import (
	"errors"
	"fmt"

	"gorgonia.org/cu"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cuda/ptx"
	"github.com/meshrun/meshrun/tensor"
)

// Gemm implements kernels.Kernels. A single float32 or bfloat16 GEMM runs
// on cuBLASLt with its epilogue fused (bias; GELU with the pre-activation
// kept; DGELU with or without the bias gradient; the bias gradient of the
// second operand), the algorithm picked once per shape and epilogue. What
// cuBLASLt refuses, float64 and batches run on cuBLAS, the epilogues as
// kernels after the GEMM (composite).
func (p *Provider) Gemm(g kernels.GemmParams, o kernels.GemmOperands) error {
	if err := p.onDevice(o.A, o.B, o.C, o.Bias, o.Aux); err != nil {
		return err
	}
	g, err := kernels.CheckGemm(g, o)
	if err != nil {
		return err
	}
	if g.BatchCount == 1 && g.DType != tensor.Float64 {
		err := p.do(func() error { return p.gemmLt(g, o) })
		if !errors.Is(err, errLtRefused) {
			return err
		}
	}
	return p.composite(g, o)
}

// composite runs the GEMM on cuBLAS (cuBLASLt without an epilogue for
// bfloat16) and the epilogue after it: the bias as a K = 1 GEMM, the bias
// gradient as a GEMV, the GELUs with the gelu kernels (C tight: LDC = N).
func (p *Provider) composite(g kernels.GemmParams, o kernels.GemmOperands) error {
	if g.DType == tensor.BFloat16 && (g.BatchCount != 1 || g.Epilogue == kernels.EpilogueBGrad) {
		return fmt.Errorf("%w: cuda bfloat16 %v of %d batches (cuBLASLt refused it)", kernels.ErrUnsupported, g.Epilogue.Op(), g.BatchCount)
	}
	n := g.M * g.N
	switch g.Epilogue {
	case kernels.EpilogueBiasGelu, kernels.EpilogueDGelu, kernels.EpilogueDGeluBGrad:
		if g.LDC != g.N {
			return fmt.Errorf("%w: cuda %v with LDC %d != N %d", kernels.ErrUnsupported, g.Epilogue, g.LDC, g.N)
		}
		base := g
		base.Epilogue = kernels.EpilogueNone
		if g.Epilogue == kernels.EpilogueBiasGelu {
			base.Epilogue = kernels.EpilogueBias
		}
		if err := p.composite(base, o); err != nil {
			return err
		}
		sfx := suffix(g.Out())
		err := p.do(func() error {
			if n == 0 {
				return nil
			}
			if g.Epilogue == kernels.EpilogueBiasGelu {
				if err := cu.MemcpyDtoD(o.Aux.Buffer().(*Buffer).ptr, o.C.Buffer().(*Buffer).ptr, int64(n*g.Out().Size())); err != nil {
					return err
				}
				return p.launch("gelu"+sfx, n, 0, ptx.BlockThreads, dev(o.C), dev(o.Aux), uint64(n))
			}
			return p.launch("gelu_grad"+sfx, n, 0, ptx.BlockThreads, dev(o.C), dev(o.C), dev(o.Aux), uint64(n))
		})
		if err != nil || g.Epilogue != kernels.EpilogueDGeluBGrad {
			return err
		}
		dy, err := o.C.Reshape(g.M, g.N)
		if err != nil {
			return err
		}
		return p.BiasGrad(o.Bias, dy, false)
	}
	if g.DType == tensor.BFloat16 {
		return p.do(func() error { return p.gemmLt(g, o) })
	}
	return p.do(func() error {
		if err := p.gemm(g, o.A, o.B, o.C); err != nil {
			return err
		}
		switch g.Epilogue {
		case kernels.EpilogueBias:
			if g.M == 0 || g.N == 0 {
				return nil
			}
			ones, err := p.onesVec(g.DType, g.M)
			if err != nil {
				return err
			}
			bc := kernels.GemmParams{M: g.M, N: g.N, K: 1, Alpha: 1, Beta: 1, LDC: g.LDC, DType: g.DType}.Normalized()
			return p.gemm(bc, ones, o.Bias, o.C)
		case kernels.EpilogueBGrad:
			// bias[i] = Σ_k op(A)[i, k]: A is K×M (TransA) or M×K, row-major.
			rows, cols, trans := g.M, g.K, false
			if g.TransA {
				rows, cols, trans = g.K, g.M, true
			}
			ones, err := p.onesVec(g.DType, g.K)
			if err != nil {
				return err
			}
			return p.gemv(kernels.GemvParams{Trans: trans, M: rows, N: cols, Alpha: 1, LDA: g.LDA, DType: g.DType}, o.A, ones, o.Bias)
		}
		return nil
	})
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

// BiasGrad implements kernels.Kernels: db = dyᵀ·ones, a GEMV; for bfloat16
// the bias_grad kernel (float32 sums).
func (p *Provider) BiasGrad(db, dy *tensor.Tensor, accumulate bool) error {
	if err := p.onDevice(db, dy); err != nil {
		return err
	}
	m, n, err := kernels.BiasDims(db, dy)
	if err != nil {
		return err
	}
	if dy.DType() == tensor.BFloat16 {
		name := "bias_grad_bf16"
		if db.DType() == tensor.Float32 {
			name = "bias_grad_bf16_f32"
		}
		return p.do(func() error {
			return p.launch(name, n, 0, ptx.BlockThreads, dev(db), dev(dy), uint64(m), uint64(n), uint64(int(betaIf(accumulate))))
		})
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

func betaIf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Axpy implements kernels.Kernels with cuBLAS axpy.
func (p *Provider) Axpy(alpha float64, x, y *tensor.Tensor) error {
	if err := p.onDevice(x, y); err != nil {
		return err
	}
	n, err := kernels.ElementwiseDims(y, x)
	if err != nil || n == 0 {
		return err
	}
	if y.DType() == tensor.BFloat16 {
		return p.do(func() error {
			return p.launch("axpy_bf16", n, 0, ptx.BlockThreads, dev(y), dev(x), scalar(tensor.Float32, alpha), uint64(n))
		})
	}
	return p.do(func() error {
		if y.DType() == tensor.Float32 {
			p.blas.Saxpy(n, float32(alpha), devSlice[float32](x), 1, devSlice[float32](y), 1)
		} else {
			p.blas.Daxpy(n, alpha, devSlice[float64](x), 1, devSlice[float64](y), 1)
		}
		return p.blas.Err()
	})
}

// GeluForward implements kernels.Kernels with the gelu kernel (ptx/kernels.h).
func (p *Provider) GeluForward(y, x *tensor.Tensor) error {
	if err := p.onDevice(y, x); err != nil {
		return err
	}
	if _, err := kernels.ElementwiseDims(y, x); err != nil {
		return err
	}
	return p.gelu(y, nil, x)
}

// GeluBackward implements kernels.Kernels with the gelu_grad kernel.
func (p *Provider) GeluBackward(dx, dy, x *tensor.Tensor) error {
	if err := p.onDevice(dx, dy, x); err != nil {
		return err
	}
	if _, err := kernels.ElementwiseDims(dx, dy, x); err != nil {
		return err
	}
	return p.gelu(dx, dy, x)
}

// MSE implements kernels.Kernels with the mse kernel and two sum stages: the
// loss stays on the device, summed in a fixed order.
func (p *Provider) MSE(dy, sum, y, target *tensor.Tensor, scale float64) error {
	if err := p.onDevice(dy, sum, y, target); err != nil {
		return err
	}
	if err := kernels.MSEDims(dy, sum, y, target); err != nil {
		return err
	}
	return p.mse(dy, sum, y, target, scale)
}

// Cast implements kernels.Kernels: a device copy, the cast kernels between
// float32 and bfloat16, float64 ones through the host (copies counted).
func (p *Provider) Cast(dst, src *tensor.Tensor) error {
	if err := p.onDevice(dst, src); err != nil {
		return err
	}
	n, err := kernels.CastDims(dst, src)
	if err != nil || n == 0 {
		return err
	}
	switch {
	case dst.DType() == src.DType():
		return p.do(func() error {
			return cu.MemcpyDtoD(dst.Buffer().(*Buffer).ptr, src.Buffer().(*Buffer).ptr, int64(dst.Bytes()))
		})
	case dst.DType() == tensor.BFloat16 && src.DType() == tensor.Float32:
		return p.do(func() error { return p.launch("cast_f32_bf16", n, 0, ptx.BlockThreads, dev(dst), dev(src), uint64(n)) })
	case dst.DType() == tensor.Float32 && src.DType() == tensor.BFloat16:
		return p.do(func() error { return p.launch("cast_bf16_f32", n, 0, ptx.BlockThreads, dev(dst), dev(src), uint64(n)) })
	}
	return p.viaHost([]*tensor.Tensor{dst}, []*tensor.Tensor{src}, func(h []*tensor.Tensor) error {
		return p.host.Cast(h[0], h[1])
	})
}

// DTypes implements kernels.Provider: float32 and float64 through cuBLAS,
// bfloat16 GEMMs through cuBLASLt (the elementwise bf16 ops through the host).
func (p *Provider) DTypes() []tensor.DType {
	return []tensor.DType{tensor.Float32, tensor.Float64, tensor.BFloat16}
}

// viaHost runs f on host copies: outs (written, and read when the op
// accumulates) then ins, all copied in before, outs copied back after.
func (p *Provider) viaHost(outs, ins []*tensor.Tensor, f func(h []*tensor.Tensor) error) error {
	h := make([]*tensor.Tensor, 0, len(outs)+len(ins))
	for _, t := range append(append([]*tensor.Tensor(nil), outs...), ins...) {
		if t == nil { // an output not asked for
			h = append(h, nil)
			continue
		}
		c, err := p.toHost(t)
		if err != nil {
			return err
		}
		h = append(h, c)
	}
	if err := f(h); err != nil {
		return err
	}
	for i, o := range outs {
		if o == nil {
			continue
		}
		if err := p.fromHost(o, h[i]); err != nil {
			return err
		}
	}
	return nil
}
