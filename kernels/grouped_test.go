package kernels_test

import (
	"errors"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// TestGroupedExperts checks the experts' GEMMs and windows: E = 1 is the
// dense op's GEMM over whole operands; an empty expert's weight GEMM has
// K = 0 (EmptyGemm writes it) and the next expert starts where it would have.
func TestGroupedExperts(t *testing.T) {
	const n, k = 6, 4
	dense := map[kernels.GroupedKind]kernels.GemmParams{
		kernels.GroupedForward:        kernels.LinearForwardGemm(5, n, k, false, tensor.Float32),
		kernels.GroupedBackwardInput:  kernels.LinearBackwardInputGemm(5, n, k, tensor.Float32),
		kernels.GroupedBackwardWeight: kernels.LinearBackwardWeightGemm(5, n, k, true, tensor.Float32),
	}
	for kind, want := range dense {
		p := kernels.GroupedParams{Kind: kind, Rows: []int{5}, N: n, K: k, DType: tensor.Float32,
			Accumulate: kind == kernels.GroupedBackwardWeight}
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
		x := p.Experts()[0]
		if x.Gemm != want || x.OffA != 0 || x.OffB != 0 || x.OffC != 0 {
			t.Errorf("%v, E = 1: %+v, want the dense GEMM %+v at offset 0", kind, x, want)
		}
	}
	p := kernels.GroupedParams{Kind: kernels.GroupedBackwardWeight, Rows: []int{2, 0, 3}, N: n, K: k,
		DType: tensor.BFloat16, OutDType: tensor.Float32, Epilogue: kernels.EpilogueBGrad}
	xs := p.Experts()
	if g := xs[1].Gemm; g.K != 0 || g.M != n || g.N != k || g.Beta != 0 || g.Out() != tensor.Float32 {
		t.Errorf("empty expert's weight GEMM %+v: want M=%d N=%d K=0, beta 0, float32 out", g, n, k)
	}
	if xs[2].OffA != 2*n || xs[2].OffB != 2*k || xs[2].OffC != 2*n*k || xs[2].OffBias != 2*n {
		t.Errorf("third expert's windows %+v", xs[2])
	}
}

// TestGroupedValidate checks that every problem is reported, wrapping
// ErrShape, and ErrDType for dtypes.
func TestGroupedValidate(t *testing.T) {
	for _, c := range []struct {
		p     kernels.GroupedParams
		dtype bool
	}{
		{kernels.GroupedParams{DType: tensor.Float32}, false},
		{kernels.GroupedParams{Rows: []int{1, -1}, DType: tensor.Float32}, false},
		{kernels.GroupedParams{Rows: []int{1}, DType: tensor.Float32, Epilogue: kernels.EpilogueDGelu}, false},
		{kernels.GroupedParams{Rows: []int{1}, DType: tensor.Float32, Accumulate: true}, false},
		{kernels.GroupedParams{Kind: 9, Rows: []int{1}, DType: tensor.Float32}, false},
		{kernels.GroupedParams{Rows: []int{1}, DType: tensor.Float32, OutDType: tensor.Float64}, true},
	} {
		err := c.p.Validate()
		if !errors.Is(err, kernels.ErrShape) || errors.Is(err, kernels.ErrDType) != c.dtype {
			t.Errorf("%+v: %v", c.p, err)
		}
	}
}
