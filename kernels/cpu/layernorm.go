package cpu

import (
	"math"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// LayerNorm implements kernels.Kernels. bfloat16 data computes in float32
// a few rows at a time (lnRows), its statistics float32.
func (p *Provider) LayerNorm(y, stats, x, gamma, beta *tensor.Tensor, eps float64) error {
	if err := p.host(y, stats, x, gamma, beta); err != nil {
		return err
	}
	rows, d, err := kernels.LayerNormDims(y, stats, x, gamma, beta)
	if err != nil {
		return err
	}
	switch x.DType() {
	case tensor.BFloat16:
		g, b := p.widen(gamma), p.widen(beta)
		p.inRows(rows, d, func(lo, hi int) {
			xs, ys := make([]float32, lnRows*d), make([]float32, lnRows*d)
			for r := lo; r < hi; r += lnRows {
				e := min(r+lnRows, hi)
				n := (e - r) * d
				p.e16.p.toF32(xs[:n], x.BFloat16()[r*d:e*d])
				layerNorm(ys[:n], stats.Float32()[2*r:2*e], xs[:n], g, b, d, 0, e-r, eps)
				p.e16.p.toBF16(y.BFloat16()[r*d:e*d], ys[:n])
			}
		})
	case tensor.Float32:
		b := orNil(beta, (*tensor.Tensor).Float32)
		p.inRows(rows, d, func(lo, hi int) {
			layerNorm(y.Float32(), stats.Float32(), x.Float32(), gamma.Float32(), b, d, lo, hi, eps)
		})
	default:
		b := orNil(beta, (*tensor.Tensor).Float64)
		p.inRows(rows, d, func(lo, hi int) {
			layerNorm(y.Float64(), stats.Float64(), x.Float64(), gamma.Float64(), b, d, lo, hi, eps)
		})
	}
	return nil
}

// lnRows is the rows of bfloat16 data a layer norm widens at a time: a few
// KiB, in cache while they are used.
const lnRows = 8

// widen is a bfloat16 tensor's data in float32 (nil for none).
func (p *Provider) widen(t *tensor.Tensor) []float32 {
	if t == nil {
		return nil
	}
	out := make([]float32, t.Len())
	p.e16.p.toF32(out, t.BFloat16())
	return out
}

// orNil is t's data, nil for no tensor (a layer norm without beta).
func orNil[T any](t *tensor.Tensor, data func(*tensor.Tensor) []T) []T {
	if t == nil {
		return nil
	}
	return data(t)
}

// lnForward32, where the machine has it, is layerNorm's float32 loop with
// vector registers: the same operations in the same order, the same result.
var lnForward32 func(y, stats, x, gamma, beta []float32, d, lo, hi int, eps float64)

func layerNorm[T float](y, stats, x, gamma, beta []T, d, lo, hi int, eps float64) {
	if y32, ok := any(y).([]float32); ok && lnForward32 != nil && d >= 16 {
		lnForward32(y32, any(stats).([]float32), any(x).([]float32), any(gamma).([]float32), any(beta).([]float32), d, lo, hi, eps)
		return
	}
	for r := lo; r < hi; r++ {
		xr, yr := x[r*d:(r+1)*d], y[r*d:(r+1)*d]
		var s0, s1, s2, s3 float64
		i := 0
		for ; i+4 <= d; i += 4 {
			s0, s1, s2, s3 = s0+float64(xr[i]), s1+float64(xr[i+1]), s2+float64(xr[i+2]), s3+float64(xr[i+3])
		}
		for ; i < d; i++ {
			s0 += float64(xr[i])
		}
		mean := ((s0 + s1) + (s2 + s3)) / float64(d)
		s0, s1, s2, s3 = 0, 0, 0, 0
		for i = 0; i+4 <= d; i += 4 {
			c0, c1, c2, c3 := float64(xr[i])-mean, float64(xr[i+1])-mean, float64(xr[i+2])-mean, float64(xr[i+3])-mean
			s0, s1, s2, s3 = s0+c0*c0, s1+c1*c1, s2+c2*c2, s3+c3*c3
		}
		for ; i < d; i++ {
			c := float64(xr[i]) - mean
			s0 += c * c
		}
		rstd := 1 / math.Sqrt(((s0+s1)+(s2+s3))/float64(d)+eps)
		m, s := T(mean), T(rstd)
		g := gamma[:d]
		if beta == nil {
			for i, v := range xr {
				yr[i] = (v - m) * s * g[i]
			}
		} else {
			b := beta[:d]
			for i, v := range xr {
				yr[i] = (v-m)*s*g[i] + b[i]
			}
		}
		stats[2*r], stats[2*r+1] = m, s
	}
}

// LayerNormBackward implements kernels.Kernels. bfloat16 data computes in
// float32 a few rows at a time, as LayerNorm does.
func (p *Provider) LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats *tensor.Tensor, accumulate bool) error {
	if err := p.host(dx, dgamma, dbeta, dy, x, gamma, stats); err != nil {
		return err
	}
	rows, d, err := kernels.LayerNormBackwardDims(dx, dgamma, dbeta, dy, x, gamma, stats)
	if err != nil {
		return err
	}
	switch x.DType() {
	case tensor.BFloat16:
		p.layerNormBackward16(dx, dgamma, dbeta, dy, x, p.widen(gamma), stats.Float32(), rows, d, accumulate)
	case tensor.Float32:
		layerNormBackward(p, f32(dx), f32(dgamma), f32(dbeta), dy.Float32(), x.Float32(), gamma.Float32(), stats.Float32(), rows, d, accumulate)
	default:
		layerNormBackward(p, f64(dx), f64(dgamma), f64(dbeta), dy.Float64(), x.Float64(), gamma.Float64(), stats.Float64(), rows, d, accumulate)
	}
	return nil
}

func layerNormBackward[T float](p *Provider, dx, dgamma, dbeta, dy, x, gamma, stats []T, rows, d int, accumulate bool) {
	if dx != nil {
		p.inRows(rows, d, func(lo, hi int) { lnDx(dx, dy, x, gamma, stats, d, lo, hi) })
	}
	if dgamma == nil && dbeta == nil {
		return
	}
	// Column sums over the rows, in float64, in row order, a block of
	// columns per piece.
	p.inRows(d, rows, func(lo, hi int) {
		g, b := make([]float64, hi-lo), make([]float64, hi-lo)
		for r := 0; r < rows; r++ {
			lnColumns(g, b, dy[r*d+lo:r*d+hi], x[r*d+lo:r*d+hi], stats[2*r], stats[2*r+1])
		}
		lnStore(dgamma, dbeta, g, b, lo, accumulate)
	})
}

// lnDx32 and lnColumns32, where the machine has them, are lnDx's and
// lnColumns' float32 loops with vector registers: the same operations in the
// same order, the same results.
var (
	lnDx32      func(dx, dy, x, gamma, stats []float32, d, lo, hi int)
	lnColumns32 func(g, b []float64, dy, x []float32, m, s float32)
)

// lnDx is rows lo..hi of the input gradient.
func lnDx[T float](dx, dy, x, gamma, stats []T, d, lo, hi int) {
	if dx32, ok := any(dx).([]float32); ok && lnDx32 != nil && d >= 16 {
		lnDx32(dx32, any(dy).([]float32), any(x).([]float32), any(gamma).([]float32), any(stats).([]float32), d, lo, hi)
		return
	}
	g := gamma[:d]
	for r := lo; r < hi; r++ {
		m, s := stats[2*r], stats[2*r+1]
		xr, dyr, dxr := x[r*d:(r+1)*d], dy[r*d:(r+1)*d], dx[r*d:(r+1)*d]
		var a0, a1, a2, a3, b0, b1, b2, b3 float64
		i := 0
		for ; i+4 <= d; i += 4 {
			g0, g1, g2, g3 := float64(dyr[i]*g[i]), float64(dyr[i+1]*g[i+1]), float64(dyr[i+2]*g[i+2]), float64(dyr[i+3]*g[i+3])
			a0, a1, a2, a3 = a0+g0, a1+g1, a2+g2, a3+g3
			b0 += g0 * float64((xr[i]-m)*s)
			b1 += g1 * float64((xr[i+1]-m)*s)
			b2 += g2 * float64((xr[i+2]-m)*s)
			b3 += g3 * float64((xr[i+3]-m)*s)
		}
		for ; i < d; i++ {
			gi := float64(dyr[i] * g[i])
			a0 += gi
			b0 += gi * float64((xr[i]-m)*s)
		}
		a, b := T(((a0+a1)+(a2+a3))/float64(d)), T(((b0+b1)+(b2+b3))/float64(d))
		for i := range xr {
			dxr[i] = s * (dyr[i]*g[i] - a - (xr[i]-m)*s*b)
		}
	}
}

// lnColumns adds one row's part of the gamma and beta gradients of a block
// of columns into g and b.
func lnColumns[T float](g, b []float64, dy, x []T, m, s T) {
	if dy32, ok := any(dy).([]float32); ok && lnColumns32 != nil {
		lnColumns32(g, b, dy32, any(x).([]float32), any(m).(float32), any(s).(float32))
		return
	}
	g, b = g[:len(dy)], b[:len(dy)]
	for i, v := range dy {
		g[i] += float64(v) * float64((x[i]-m)*s)
		b[i] += float64(v)
	}
}

// lnStore writes (or adds) the column sums of columns lo.. into dgamma and
// dbeta, either of which may be nil.
func lnStore[T float](dgamma, dbeta []T, g, b []float64, lo int, accumulate bool) {
	for i := range g {
		if dgamma != nil {
			if accumulate {
				dgamma[lo+i] += T(g[i])
			} else {
				dgamma[lo+i] = T(g[i])
			}
		}
		if dbeta != nil {
			if accumulate {
				dbeta[lo+i] += T(b[i])
			} else {
				dbeta[lo+i] = T(b[i])
			}
		}
	}
}

// layerNormBackward16 is layerNormBackward on bfloat16 data, widened a few
// rows (or a block of columns of a row) at a time; dgamma and dbeta are
// rounded once, after the float32 sum or add.
func (p *Provider) layerNormBackward16(dx, dgamma, dbeta, dy, x *tensor.Tensor, gamma, stats []float32, rows, d int, accumulate bool) {
	if dx != nil {
		p.inRows(rows, d, func(lo, hi int) {
			xs, dys, dxs := make([]float32, lnRows*d), make([]float32, lnRows*d), make([]float32, lnRows*d)
			for r := lo; r < hi; r += lnRows {
				e := min(r+lnRows, hi)
				n := (e - r) * d
				p.e16.p.toF32(xs[:n], x.BFloat16()[r*d:e*d])
				p.e16.p.toF32(dys[:n], dy.BFloat16()[r*d:e*d])
				lnDx(dxs[:n], dys[:n], xs[:n], gamma, stats[2*r:2*e], d, 0, e-r)
				p.e16.p.toBF16(dx.BFloat16()[r*d:e*d], dxs[:n])
			}
		})
	}
	if dgamma == nil && dbeta == nil {
		return
	}
	dg, db := p.widenOut(dgamma, accumulate), p.widenOut(dbeta, accumulate)
	p.inRows(d, rows, func(lo, hi int) {
		g, b := make([]float64, hi-lo), make([]float64, hi-lo)
		xs, dys := make([]float32, hi-lo), make([]float32, hi-lo)
		for r := 0; r < rows; r++ {
			p.e16.p.toF32(xs, x.BFloat16()[r*d+lo:r*d+hi])
			p.e16.p.toF32(dys, dy.BFloat16()[r*d+lo:r*d+hi])
			lnColumns(g, b, dys, xs, stats[2*r], stats[2*r+1])
		}
		lnStore(dg, db, g, b, lo, accumulate)
		if dgamma != nil {
			p.e16.p.toBF16(dgamma.BFloat16()[lo:hi], dg[lo:hi])
		}
		if dbeta != nil {
			p.e16.p.toBF16(dbeta.BFloat16()[lo:hi], db[lo:hi])
		}
	})
}

// widenOut is a bfloat16 output in float32: its values where the op adds
// into it, else zeros (nil for none).
func (p *Provider) widenOut(t *tensor.Tensor, accumulate bool) []float32 {
	if t == nil || accumulate {
		return p.widen(t)
	}
	return make([]float32, t.Len())
}
