package cpu

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// GroupedGemm implements kernels.Kernels: each expert is its dense GEMM on
// windows of the packed operands (kernels.GroupedParams.Experts), on the GEMM
// engine. Experts run side by side, one core each, largest first, each
// packing its own weight: an expert of 128 rows spread over every core pays
// the engine's split and a barrier per expert, and ran at 0.72 of the dense
// GEMM's speed against 0.86-0.90 side by side (BenchmarkGroupedVsDense, E =
// 8 balanced, 2 cores; 0.94-0.97 since the engine packs an expert's weight
// one micro-panel at a time into an L2-resident slot, see gemmJob.block). An expert runs alone on every core, in expert order,
// when side by side would leave cores idle: when it holds more than a core's
// share of the work (E = 1, or one expert taking most tokens) and is worth
// the split (threads·workPerThr flops or more). Empty experts run alone too
// (EmptyGemm calls back into Gemm on every core). Each expert's result is the
// dense GEMM's whatever the thread count (the engine never splits K).
func (p *Provider) GroupedGemm(g kernels.GroupedParams, o kernels.GemmOperands) error {
	if err := p.host(o.A, o.B, o.C, o.Bias, o.Aux); err != nil {
		return err
	}
	if err := kernels.CheckGrouped(g, o); err != nil {
		return err
	}
	xs := g.Experts()
	t := p.nthreads()
	total := 0.0
	for _, x := range xs {
		total += x.Gemm.Flops()
	}
	j := &groupJob{p: p}
	for _, x := range xs {
		eo, err := x.Operands(o, kernels.HostWindow)
		if err != nil {
			return err
		}
		// Empty experts (EmptyGemm calls back into Gemm on every core) run
		// here, never inside a part.
		f := x.Gemm.Flops()
		if alone := f > total/float64(t) && f >= float64(t*workPerThr); t > 1 && f > 0 && !alone {
			j.gemms = append(j.gemms, x.Gemm)
			j.ops = append(j.ops, eo)
			continue
		}
		if err := p.expertGemm(x.Gemm, eo, t); err != nil {
			return err
		}
	}
	if len(j.gemms) > 0 {
		j.sortLargestFirst()
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

// sortLargestFirst orders the experts by decreasing flops, so that the last
// ones the cores take are the small ones and the cores finish together.
func (j *groupJob) sortLargestFirst() {
	idx := make([]int, len(j.gemms))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(j.gemms[b].Flops(), j.gemms[a].Flops()) })
	gemms, ops := make([]kernels.GemmParams, len(idx)), make([]kernels.GemmOperands, len(idx))
	for i, k := range idx {
		gemms[i], ops[i] = j.gemms[k], j.ops[k]
	}
	j.gemms, j.ops = gemms, ops
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
