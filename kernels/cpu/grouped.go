package cpu

import (
	"sync"
	"sync/atomic"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// GroupedGemm implements kernels.Kernels: each expert is its dense GEMM on
// windows of the packed operands (kernels.GroupedParams.Experts), on the GEMM
// engine. An expert worth every core (threads·workPerThr flops or more) runs
// alone on all of them, in expert order, its weight packed once by the engine;
// the smaller ones run side by side, one core each, so that many experts of
// few rows keep every core busy. Empty experts run alone (EmptyGemm's rules). Each expert's result is the dense GEMM's
// whatever the thread count (the engine never splits K).
func (p *Provider) GroupedGemm(g kernels.GroupedParams, o kernels.GemmOperands) error {
	if err := p.host(o.A, o.B, o.C, o.Bias, o.Aux); err != nil {
		return err
	}
	if err := kernels.CheckGrouped(g, o); err != nil {
		return err
	}
	xs := g.Experts()
	t := p.nthreads()
	j := &groupJob{p: p}
	for _, x := range xs {
		eo, err := x.Operands(o, kernels.HostWindow)
		if err != nil {
			return err
		}
		// Empty experts (EmptyGemm calls back into Gemm on every core) run
		// here, never inside a part.
		if f := x.Gemm.Flops(); t > 1 && f > 0 && f < float64(t*workPerThr) {
			j.gemms = append(j.gemms, x.Gemm)
			j.ops = append(j.ops, eo)
			continue
		}
		if err := p.expertGemm(x.Gemm, eo, t); err != nil {
			return err
		}
	}
	if len(j.gemms) > 0 {
		j.errs = make([]error, min(t, len(j.gemms)))
		parallel(j, len(j.errs), &j.wg)
		for _, err := range j.errs {
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// expertGemm runs one expert's GEMM on up to t goroutines, an empty one as
// kernels.EmptyGemm defines it.
func (p *Provider) expertGemm(g kernels.GemmParams, o kernels.GemmOperands, t int) error {
	g, err := kernels.CheckGemm(g, o)
	if err != nil {
		return err
	}
	if empty, err := kernels.EmptyGemm(p, tensor.Host, g, o); empty {
		return err
	}
	p.gemm(g, o, t)
	return nil
}

// groupJob runs small experts side by side: each part takes the next expert
// until none is left.
type groupJob struct {
	p     *Provider
	gemms []kernels.GemmParams
	ops   []kernels.GemmOperands
	next  atomic.Int64
	errs  []error
	wg    sync.WaitGroup
}

func (j *groupJob) run(part int) {
	for {
		i := int(j.next.Add(1) - 1)
		if i >= len(j.gemms) {
			return
		}
		if err := j.p.expertGemm(j.gemms[i], j.ops[i], 1); err != nil && j.errs[part] == nil {
			j.errs[part] = err
		}
	}
}
