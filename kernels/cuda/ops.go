//go:build cuda

package cuda

import (
	"errors"
	"fmt"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cuda/ptx"
	"github.com/meshrun/meshrun/tensor"
)

// Gemm implements kernels.Kernels by the GEMM's plan (planGemm): a single
// float32 or bfloat16 GEMM on cuBLASLt with its epilogue fused, the
// algorithm picked once per shape and epilogue; what cuBLASLt refuses,
// float64 and batches on cuBLAS, the epilogue after it as kernels and
// cuBLAS calls. Empty dimensions never reach a library (kernels.EmptyGemm).
func (p *Provider) Gemm(g kernels.GemmParams, o kernels.GemmOperands) error {
	return p.gemmPlanned(g, o, p.opts.NoLt)
}

// gemmPlanned is Gemm, cuBLASLt not tried when noLt.
func (p *Provider) gemmPlanned(g kernels.GemmParams, o kernels.GemmOperands, noLt bool) error {
	if err := p.onDevice(o.A, o.B, o.C, o.Bias, o.Aux); err != nil {
		return err
	}
	g, err := kernels.CheckGemm(g, o)
	if err != nil {
		return err
	}
	if empty, err := kernels.EmptyGemm(p, p.mem, g, o); empty {
		return err
	}
	pl := planGemm(g)
	if pl.refused() {
		return fmt.Errorf("%w: cuda %v -> %v %v", kernels.ErrUnsupported, g.DType, g.Out(), g.Epilogue.Op())
	}
	pl.lt = pl.lt && !noLt && !(p.opts.BGradSplit && g.Epilogue == kernels.EpilogueBGrad)
	return p.do(func() error {
		if pl.lt {
			err := p.gemmLt(g, o)
			if !errors.Is(err, errLtRefused) {
				p.served = pl.describe(g, false)
				return err
			}
		}
		p.served = pl.describe(g, true)
		return runPlan(p, g, pl, o)
	})
}

// Gemv implements kernels.Kernels on cuBLAS.
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

// BiasGrad implements kernels.Kernels: db (+)= onesᵀ·dy on cuBLAS; for a
// bfloat16 dy the bias_part and bias_sum kernels (double sums over chunks
// of rows, then over the chunks).
func (p *Provider) BiasGrad(db, dy *tensor.Tensor, accumulate bool) error {
	if err := p.onDevice(db, dy); err != nil {
		return err
	}
	m, n, err := kernels.BiasDims(db, dy)
	if err != nil || n == 0 {
		return err
	}
	switch opPath(kernels.OpBiasGrad, dy.DType(), db.DType(), false) {
	case Kernel:
		// In two stages (ptx's bias_*): each chunk of ptx.BiasChunk rows of
		// each column, then each column's chunks: one thread per column
		// alone left most of the GPU idle (10.8 ms a GPT step).
		name := "bias_sum_bf16"
		if db.DType() == tensor.Float32 {
			name = "bias_sum_bf16_f32"
		}
		nc := (m + ptx.BiasChunk - 1) / ptx.BiasChunk
		part, err := p.mem.Alloc(tensor.Float64, max(nc*n, 1))
		if err != nil {
			return err
		}
		defer p.freeAfter(part)
		return p.do(func() error {
			if m > 0 {
				if err := p.launch("bias_part_bf16", nc*n, 0, ptx.BlockThreads, dev(part), dev(dy), uint64(m), uint64(n), uint64(ptx.BiasChunk)); err != nil {
					return err
				}
			}
			return p.launch(name, n, 0, ptx.BlockThreads, dev(db), dev(part), uint64(nc), uint64(n), uint64(int(betaIf(accumulate))))
		})
	case BLAS:
		dt := db.DType()
		return p.do(func() error {
			if m == 0 { // a sum of no rows
				if accumulate {
					return nil
				}
				return p.memset(dev(db), n*dt.Size())
			}
			ones, err := p.onesVec(dt, m)
			if err != nil {
				return err
			}
			g := kernels.GemmParams{M: 1, N: n, K: m, Alpha: 1, Beta: betaIf(accumulate), DType: dt}.Normalized()
			return p.gemm(g, ones, dev(dy), dev(db))
		})
	}
	return p.refused(kernels.OpBiasGrad, dy.DType())
}

// refused is the error of an op whose plan is Refused.
func (p *Provider) refused(op kernels.Op, dt tensor.DType) error {
	return fmt.Errorf("%w: cuda %v on %v", kernels.ErrUnsupported, op, dt)
}

func betaIf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Axpy implements kernels.Kernels: cuBLAS axpy, the axpy kernel for bfloat16.
func (p *Provider) Axpy(alpha float64, x, y *tensor.Tensor) error {
	if err := p.onDevice(x, y); err != nil {
		return err
	}
	n, err := kernels.ElementwiseDims(y, x)
	if err != nil || n == 0 {
		return err
	}
	switch opPath(kernels.OpAxpy, y.DType(), y.DType(), false) {
	case Kernel:
		return p.do(func() error {
			return p.launch("axpy_bf16", n, 0, ptx.BlockThreads, dev(y), dev(x), scalar(tensor.Float32, alpha), uint64(n))
		})
	case BLAS:
		return p.do(func() error { return p.axpy(y.DType(), n, alpha, dev(x), dev(y)) })
	}
	return p.refused(kernels.OpAxpy, y.DType())
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
	switch opPath(kernels.OpCast, src.DType(), dst.DType(), false) {
	case Copy, Kernel:
		return p.do(func() error { return convert2D(p, dev(dst), n, dst.DType(), dev(src), n, src.DType(), 1, n) })
	case Host:
		return p.viaHost([]*tensor.Tensor{dst}, []*tensor.Tensor{src}, func(h []*tensor.Tensor) error {
			return p.host.Cast(h[0], h[1])
		})
	}
	return p.refused(kernels.OpCast, src.DType())
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
