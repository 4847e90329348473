package kernels

import (
	"errors"
	"fmt"

	"github.com/meshrun/meshrun/tensor"
)

// The grouped linear layer's ops (a mixture of experts), each one GroupedGemm:
// expert e owns rows Σ rows[:e] .. Σ rows[:e+1] of the packed x, y, dx, dy and
// aux, and the e-th matrix or row of w[E,N,K], b[E,N], dw and db.
//
//	GroupedLinearForward         y[R,N] = x[R,K]·w_eᵀ + b_e (b may be nil)
//	GroupedLinearForwardGelu     y = gelu(x·w_eᵀ + b_e), aux = the pre-activation
//	GroupedLinearBackwardInput   dx[R,K] = dy[R,N]·w_e
//	GroupedLinearBackwardInputGelu dx = (dy·w_e) ⊙ gelu'(aux); db[E,K] = Σ rows
//	                             of dx_e when db is not nil
//	GroupedLinearBackwardWeight  dw[E,N,K] (+)= dy_eᵀ·x_e; db[E,N] = Σ rows of
//	                             dy_e (overwritten) when db is not nil
//	GroupedLinearBackwardBias    db[E,N] (+)= Σ rows of dy_e
//
// An expert with no rows gets zero weight and bias gradients (written), or
// keeps them exactly when accumulating.

func groupedParams(kind GroupedKind, rows []int, n, k int, in, out *tensor.Tensor) GroupedParams {
	p := GroupedParams{Kind: kind, Rows: rows, N: n, K: k, DType: in.DType()}
	if out.DType() != in.DType() {
		p.OutDType = out.DType()
	}
	return p
}

// wDims returns N and K of a weight w[E,N,K] (zeros when it has another rank:
// CheckGrouped reports it).
func wDims(w *tensor.Tensor) (n, k int) {
	if w == nil || w.Rank() != 3 {
		return 0, 0
	}
	return w.Dim(1), w.Dim(2)
}

// GroupedLinearForward computes y_e = x_e·w_eᵀ (+ b_e) for every expert.
func GroupedLinearForward(k Kernels, rows []int, y, x, w, b *tensor.Tensor) error {
	n, kk := wDims(w)
	p := groupedParams(GroupedForward, rows, n, kk, x, y)
	if b != nil {
		p.Epilogue = EpilogueBias
	}
	return k.GroupedGemm(p, GemmOperands{A: x, B: w, C: y, Bias: b})
}

// GroupedLinearForwardGelu computes y_e = gelu(x_e·w_eᵀ + b_e), keeping the
// pre-activation in aux (y's shape).
func GroupedLinearForwardGelu(k Kernels, rows []int, y, aux, x, w, b *tensor.Tensor) error {
	n, kk := wDims(w)
	p := groupedParams(GroupedForward, rows, n, kk, x, y)
	p.Epilogue = EpilogueBiasGelu
	return k.GroupedGemm(p, GemmOperands{A: x, B: w, C: y, Bias: b, Aux: aux})
}

// GroupedLinearBackwardInput computes dx_e = dy_e·w_e.
func GroupedLinearBackwardInput(k Kernels, rows []int, dx, dy, w *tensor.Tensor) error {
	n, kk := wDims(w)
	return k.GroupedGemm(groupedParams(GroupedBackwardInput, rows, n, kk, dy, dx), GemmOperands{A: dy, B: w, C: dx})
}

// GroupedLinearBackwardInputGelu computes dx_e = (dy_e·w_e) ⊙ gelu'(aux_e)
// and, when db is not nil, db_e = Σ rows of dx_e.
func GroupedLinearBackwardInputGelu(k Kernels, rows []int, dx, db, dy, w, aux *tensor.Tensor) error {
	n, kk := wDims(w)
	p := groupedParams(GroupedBackwardInput, rows, n, kk, dy, dx)
	p.Epilogue = EpilogueDGelu
	if db != nil {
		p.Epilogue = EpilogueDGeluBGrad
	}
	return k.GroupedGemm(p, GemmOperands{A: dy, B: w, C: dx, Bias: db, Aux: aux})
}

// GroupedLinearBackwardWeight computes dw_e (+)= dy_eᵀ·x_e and, when db is not
// nil, db_e = Σ rows of dy_e (overwritten: accumulate applies to dw only).
func GroupedLinearBackwardWeight(k Kernels, rows []int, dw, db, dy, x *tensor.Tensor, accumulate bool) error {
	n, kk := wDims(dw)
	p := groupedParams(GroupedBackwardWeight, rows, n, kk, dy, dw)
	p.Accumulate = accumulate
	if db != nil {
		p.Epilogue = EpilogueBGrad
	}
	return k.GroupedGemm(p, GemmOperands{A: dy, B: x, C: dw, Bias: db})
}

// GroupedLinearBackwardBias computes db_e (+)= Σ rows of dy_e, the bias
// gradient alone: the grouped weight GEMM dw_e[N,1] (+)= dy_eᵀ·ones_e, with
// db viewed as [E,N,1] and a column of ones[R,1] in dy's memory (written
// there, a counted transfer).
func GroupedLinearBackwardBias(k Kernels, rows []int, db, dy *tensor.Tensor, accumulate bool) (err error) {
	if db == nil || dy == nil || db.Rank() != 2 || dy.Rank() != 2 {
		return fmt.Errorf("%w: grouped bias gradient db=%v dy=%v: want db[E,N], dy[R,N]", ErrShape, db, dy)
	}
	mem := tensor.Host
	if !dy.OnHost() {
		mem = dy.Buffer().Memory()
	}
	ones, err := tensor.Upload(mem, Ones(dy.DType(), dy.Dim(0)))
	if err != nil {
		return err
	}
	if !dy.OnHost() {
		defer func() { err = errors.Join(err, mem.Free(ones)) }()
	}
	col, err := ones.Reshape(dy.Dim(0), 1)
	if err != nil {
		return err
	}
	dw, err := db.Reshape(db.Dim(0), db.Dim(1), 1)
	if err != nil {
		return err
	}
	return GroupedLinearBackwardWeight(k, rows, dw, nil, dy, col, accumulate)
}
