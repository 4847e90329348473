//go:build cuda

package cuda

import (
	"fmt"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
	"gorgonia.org/cu"
)

// ltAlign is the operand alignment cuBLASLt's heuristic assumes by default
// (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES): the alignment of an
// allocation, not of a window into one.
const ltAlign = 256

// GroupedGemm implements kernels.Kernels: one GEMM per expert, in expert
// order on the provider's stream, each by its plan (planGemm, as Gemm) on
// windows of the packed operands; an expert whose windows are not all
// ltAlign-aligned skips cuBLASLt for the cuBLAS plan, which takes any
// alignment. Empty experts never reach a library (kernels.EmptyGemm).
func (p *Provider) GroupedGemm(g kernels.GroupedParams, o kernels.GemmOperands) error {
	if err := p.onDevice(o.A, o.B, o.C, o.Bias, o.Aux); err != nil {
		return err
	}
	if err := kernels.CheckGrouped(g, o); err != nil {
		return err
	}
	for _, x := range g.Experts() {
		eo, err := x.Operands(o, p.window)
		if err != nil {
			return err
		}
		aligned := true
		for _, t := range []*tensor.Tensor{eo.A, eo.B, eo.C, eo.Bias, eo.Aux} {
			aligned = aligned && (t == nil || dev(t)%ltAlign == 0)
		}
		if err := p.gemmPlanned(x.Gemm, eo, p.opts.NoLt || !aligned); err != nil {
			return err
		}
	}
	return nil
}

// window implements kernels.Window: a tensor over t's device memory from
// element off, sharing t's allocation (never freed itself).
func (p *Provider) window(t *tensor.Tensor, off int, shape ...int) (*tensor.Tensor, error) {
	b, err := p.mem.buffer(t)
	if err != nil {
		return nil, err
	}
	size := t.DType().Size()
	n := tensor.NumElements(shape)
	if off < 0 || (off+n)*size > b.n {
		return nil, fmt.Errorf("%w: window [%d, %d) of %v", kernels.ErrShape, off, off+n, t)
	}
	w := &Buffer{ptr: b.ptr + cu.DevicePtr(off*size), n: n * size, mem: b.mem}
	return tensor.OnDevice(w, t.DType(), shape...)
}
