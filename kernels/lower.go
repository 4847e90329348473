package kernels

import (
	"fmt"

	"github.com/meshrun/meshrun/tensor"
)

// The linear layer's and batched matmul's ops, lowered onto Kernels once for
// every provider. Shapes (row-major; "..." is any number of leading dims,
// flattened into M):
//
//	LinearForward         y[...,N] = x[...,K] · w[N,K]ᵀ + b[N]  (b may be nil)
//	LinearForwardGelu     y = gelu(x·wᵀ + b), aux = x·wᵀ + b (kept for the backward)
//	LinearBackwardInput   dx[...,K] = dy[...,N] · w[N,K]
//	LinearBackwardWeight  dw[N,K] (+)= dy[...,N]ᵀ · x[...,K]
//	LinearBackwardBias    db[N] (+)= Σ over rows of dy[...,N]
//	MatmulForward         c[B,M,N] = a[B,M,K] · b[B,K,N]   (rank 2 means B = 1)
//	MatmulBackwardInput   da[B,M,K] (+)= dc[B,M,N] · b[B,K,N]ᵀ
//	MatmulBackwardOther   db[B,K,N] (+)= a[B,M,K]ᵀ · dc[B,M,N]
//
// (+)= means the result is added to the output when accumulate is true and
// overwrites it (without reading it) otherwise. Each is one Gemm (the bias in its
// epilogue) or one BiasGrad.

// LinearForward computes y = x·wᵀ + b with one GEMM, the bias in its epilogue.
func LinearForward(k Kernels, y, x, w, b *tensor.Tensor) error {
	m, n, kk, err := LinearDims(y, x, w, b)
	if err != nil {
		return err
	}
	return k.Gemm(outType(LinearForwardGemm(m, n, kk, b != nil, x.DType()), y), GemmOperands{A: x, B: w, C: y, Bias: b})
}

// outType sets p's output dtype to c's.
func outType(p GemmParams, c *tensor.Tensor) GemmParams {
	if c.DType() != p.DType {
		p.OutDType = c.DType()
	}
	return p
}

// LinearForwardGelu computes y = gelu(x·wᵀ + b) with one GEMM, keeping the
// pre-activation in aux (y's shape) for LinearBackwardInputGelu.
func LinearForwardGelu(k Kernels, y, aux, x, w, b *tensor.Tensor) error {
	m, n, kk, err := LinearDims(y, x, w, b)
	if err != nil {
		return err
	}
	if b == nil || aux == nil || !tensor.SameShape(aux, y) {
		return fmt.Errorf("%w: linear+gelu needs a bias and aux shaped as y=%v, have b=%v aux=%v", ErrShape, y, b, aux)
	}
	p := outType(LinearForwardGemm(m, n, kk, true, x.DType()), y)
	p.Epilogue = EpilogueBiasGelu
	return k.Gemm(p, GemmOperands{A: x, B: w, C: y, Bias: b, Aux: aux})
}

// LinearBackwardInput computes dx = dy·w.
func LinearBackwardInput(k Kernels, dx, dy, w *tensor.Tensor) error {
	m, n, kk, err := LinearDims(dy, dx, w, nil)
	if err != nil {
		return err
	}
	return k.Gemm(outType(LinearBackwardInputGemm(m, n, kk, dy.DType()), dx), GemmOperands{A: dy, B: w, C: dx})
}

// LinearBackwardInputGelu computes dx = (dy·w) ⊙ gelu'(aux), the gradient
// through a GELU whose pre-activation aux (dx's shape) the forward kept, and,
// when db is not nil, db = Σ over rows of dx (the bias gradient of the layer
// that produced aux), in one GEMM.
func LinearBackwardInputGelu(k Kernels, dx, db, dy, w, aux *tensor.Tensor) error {
	m, n, kk, err := LinearDims(dy, dx, w, nil)
	if err != nil {
		return err
	}
	if aux == nil || !tensor.SameShape(aux, dx) || (db != nil && (db.Rank() != 1 || db.Dim(0) != kk)) {
		return fmt.Errorf("%w: linear input gradient through gelu: dx=%v aux=%v db=%v", ErrShape, dx, aux, db)
	}
	p := outType(LinearBackwardInputGemm(m, n, kk, dy.DType()), dx)
	p.Epilogue = EpilogueDGelu
	if db != nil {
		p.Epilogue = EpilogueDGeluBGrad
	}
	return k.Gemm(p, GemmOperands{A: dy, B: w, C: dx, Bias: db, Aux: aux})
}

// LinearBackwardWeight computes dw (+)= dyᵀ·x.
func LinearBackwardWeight(k Kernels, dw, dy, x *tensor.Tensor, accumulate bool) error {
	m, n, kk, err := LinearDims(dy, x, dw, nil)
	if err != nil {
		return err
	}
	return k.Gemm(outType(LinearBackwardWeightGemm(m, n, kk, accumulate, dy.DType()), dw), GemmOperands{A: dy, B: x, C: dw})
}

// LinearBackwardWeightBias computes dw (+)= dyᵀ·x and db = Σ over rows of dy
// (overwritten: accumulate applies to dw only) in one GEMM.
func LinearBackwardWeightBias(k Kernels, dw, db, dy, x *tensor.Tensor, accumulate bool) error {
	m, n, kk, err := LinearDims(dy, x, dw, nil)
	if err != nil {
		return err
	}
	if _, _, err := BiasDims(db, dy); err != nil {
		return err
	}
	p := outType(LinearBackwardWeightGemm(m, n, kk, accumulate, dy.DType()), dw)
	p.Epilogue = EpilogueBGrad
	return k.Gemm(p, GemmOperands{A: dy, B: x, C: dw, Bias: db})
}

// LinearBackwardBias computes db (+)= Σ over rows of dy.
func LinearBackwardBias(k Kernels, db, dy *tensor.Tensor, accumulate bool) error {
	if _, _, err := BiasDims(db, dy); err != nil {
		return err
	}
	return k.BiasGrad(db, dy, accumulate)
}

// MatmulForward computes c = a·b.
func MatmulForward(k Kernels, c, a, b *tensor.Tensor) error {
	batch, m, n, kk, err := MatmulDims(c, a, b)
	if err != nil {
		return err
	}
	if batch == 0 { // no matrices (GemmParams' BatchCount 0 means one)
		return nil
	}
	return k.Gemm(MatmulForwardGemm(batch, m, n, kk, c.DType()), GemmOperands{A: a, B: b, C: c})
}

// MatmulBackwardInput computes da (+)= dc·bᵀ.
func MatmulBackwardInput(k Kernels, da, dc, b *tensor.Tensor, accumulate bool) error {
	batch, m, n, kk, err := MatmulDims(dc, da, b)
	if err != nil {
		return err
	}
	if batch == 0 { // no matrices (GemmParams' BatchCount 0 means one)
		return nil
	}
	return k.Gemm(MatmulBackwardInputGemm(batch, m, n, kk, accumulate, da.DType()), GemmOperands{A: dc, B: b, C: da})
}

// MatmulBackwardOther computes db (+)= aᵀ·dc.
func MatmulBackwardOther(k Kernels, db, dc, a *tensor.Tensor, accumulate bool) error {
	batch, m, n, kk, err := MatmulDims(dc, a, db)
	if err != nil {
		return err
	}
	if batch == 0 { // no matrices (GemmParams' BatchCount 0 means one)
		return nil
	}
	return k.Gemm(MatmulBackwardOtherGemm(batch, m, n, kk, accumulate, db.DType()), GemmOperands{A: a, B: dc, C: db})
}
