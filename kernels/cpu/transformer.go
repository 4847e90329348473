package cpu

import (
	"math"
	"sync"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// inRows runs f over [0, n) rows in pieces of about grain elements of work,
// split over the provider's threads.
func (p *Provider) inRows(n, work int, f func(lo, hi int)) {
	parts := max(1, min(p.nthreads(), n*max(work, 1)/(1<<15), n))
	if parts == 1 {
		f(0, n)
		return
	}
	j := pieceJob{n: n, parts: parts, f: func(_, lo, hi int) { f(lo, hi) }}
	var wg sync.WaitGroup
	parallel(&j, parts, &wg)
}

// widened runs f on float32 stand-ins for the bfloat16 tensors among ts
// (the others, nil or not bfloat16, passed as they are) and rounds the
// first nout, the outputs, back into their bfloat16 tensors once: the
// transformer ops on bfloat16 data compute in float32. Outputs are widened
// too, for the ops that accumulate into them, unless overwrite says the op
// writes every element of them. The stand-ins are reused from call to call.
func (p *Provider) widened(nout int, overwrite bool, ts []*tensor.Tensor, f func(w []*tensor.Tensor) error) error {
	w := make([]*tensor.Tensor, len(ts))
	var bufs []*wideBuf
	defer func() {
		for _, b := range bufs {
			if cap(b.d) <= widePoolMax {
				widePool.put(b)
			}
		}
	}()
	for i, t := range ts {
		if t == nil || t.DType() != tensor.BFloat16 {
			w[i] = t
			continue
		}
		b := widePool.get()
		bufs = append(bufs, b)
		if cap(b.d) < t.Len() {
			b.d = make([]float32, t.Len())
		}
		var err error
		if w[i], err = tensor.FromFloat32(b.d[:t.Len()], t.Shape()...); err != nil {
			return err
		}
		if i < nout && overwrite {
			continue
		}
		p.e16.p.toF32(w[i].Float32(), t.BFloat16())
	}
	if err := f(w); err != nil {
		return err
	}
	for i := 0; i < nout; i++ {
		if ts[i] != nil && ts[i].DType() == tensor.BFloat16 {
			if err := p.Cast(ts[i], w[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// wideBuf is a float32 stand-in's storage (widened).
type wideBuf struct{ d []float32 }

// widePoolMax is the largest stand-in kept for the next call (16 MiB); a
// larger one (a big vocabulary's logits) is left to the collector.
const widePoolMax = 4 << 20

var widePool freeList[wideBuf]

// Attention implements kernels.Kernels.
func (p *Provider) Attention(o, lse, q, k, v *tensor.Tensor, causal bool) error {
	if err := p.host(o, lse, q, k, v); err != nil {
		return err
	}
	b, h, s, t, e, f, err := kernels.AttentionDims(o, lse, q, k, v)
	if err != nil {
		return err
	}
	if q.DType() == tensor.BFloat16 {
		return p.widened(2, true, []*tensor.Tensor{o, lse, q, k, v}, func(w []*tensor.Tensor) error {
			return p.Attention(w[0], w[1], w[2], w[3], w[4], causal)
		})
	}
	a := newAttn(h, s, t, e, f, causal, k == nil)
	if q.DType() == tensor.Float32 {
		qq, kk, vv := splitQKV(a, q.Float32(), f32(k), f32(v))
		mm := p.matmul32()
		p.inRows(b*h, s*t*(e+f), func(lo, hi int) { attention(a, mm, o.Float32(), lse.Float32(), qq, kk, vv, lo, hi) })
	} else {
		qq, kk, vv := splitQKV(a, q.Float64(), f64(k), f64(v))
		mm := p.matmul64()
		p.inRows(b*h, s*t*(e+f), func(lo, hi int) { attention(a, mm, o.Float64(), lse.Float64(), qq, kk, vv, lo, hi) })
	}
	return nil
}

func newAttn(h, s, t, e, f int, causal, packed bool) attnShape {
	a := attnShape{h: h, s: s, t: t, e: e, f: f, causal: causal, qs: e, ks: e, vs: f}
	if packed {
		a.qs, a.ks, a.vs, a.packed = 3*e, 3*e, 3*e, true
	}
	return a
}

// splitQKV returns q, k and v: the tensors given, or the three views of a
// packed qkv.
func splitQKV[T float](a attnShape, q, k, v []T) ([]T, []T, []T) {
	if !a.packed {
		return q, k, v
	}
	return q, q[a.e:], q[2*a.e:]
}

// attnShape is one attention problem in the [batch, seq, heads, dim]
// layout; its (batch, head) pairs bh = b·H + h are the units of work.
type attnShape struct {
	h, s, t, e, f int
	causal        bool
	// qs, ks, vs: the elements from one row of q, k, v to the next (e, e, f;
	// 3e each when packed).
	qs, ks, vs int
	packed     bool
}

// keys is the number of keys query row i sees.
func (a attnShape) keys(i int) int {
	if a.causal {
		return min(i+1, a.t)
	}
	return a.t
}

// at is the offset of row i of pair bh in a [B, rows, H, width] tensor.
func (a attnShape) at(bh, rows, i, width int) int {
	b, h := bh/a.h, bh%a.h
	return ((b*rows+i)*a.h + h) * width
}

// matmul is one single-threaded GEMM on host slices (the caller splits the
// work): attention's products per batch and head, on strided rows.
type matmul[T float] func(g kernels.GemmParams, a, b, c []T)

func (p *Provider) matmul32() matmul[float32] {
	return func(g kernels.GemmParams, a, b, c []float32) {
		g.DType = tensor.Float32
		if err := runGemm(&p.e32, 1, g, a, b, c); err != nil {
			panic(err) // shapes checked by AttentionDims
		}
	}
}

func (p *Provider) matmul64() matmul[float64] {
	return func(g kernels.GemmParams, a, b, c []float64) {
		g.DType = tensor.Float64
		if err := runGemm(&p.e64, 1, g, a, b, c); err != nil {
			panic(err)
		}
	}
}

// expShift32 and expShift64, where the machine has them, compute
// exp(float64(src[i]) − shift) for every i, rounded to float32 into dst (which
// may be src) or kept in float64, in vector registers: math.Exp's results
// bit for bit.
var (
	expShift32 func(dst, src []float32, shift float64)
	expShift64 func(dst []float64, src []float32, shift float64)
)

// scores computes pair bh's probabilities into pr[s×t] (zeros where the
// mask hides a key): from the scaled products q·kᵀ, and their log-sum-exp
// into lse (ext holds a row's exponentials), or from lse when it is given
// (the backward).
func scores[T float](a attnShape, mm matmul[T], pr []T, ext []float64, q, k, lse []T, bh int, known bool) {
	scale := 1 / math.Sqrt(float64(a.e))
	mm(kernels.GemmParams{TransB: true, M: a.s, N: a.t, K: a.e, Alpha: scale, LDA: a.h * a.qs, LDB: a.h * a.ks, LDC: a.t},
		q[a.at(bh, a.s, 0, a.qs):], k[a.at(bh, a.t, 0, a.ks):], pr)
	for i := 0; i < a.s; i++ {
		row, nk := pr[i*a.t:(i+1)*a.t], a.keys(i)
		if known {
			m := float64(lse[bh*a.s+i])
			if r32, ok := any(row[:nk]).([]float32); ok && expShift32 != nil {
				expShift32(r32, r32, m)
			} else {
				for j := range row[:nk] {
					row[j] = T(math.Exp(float64(row[j]) - m))
				}
			}
		} else {
			// One exponential per score: exp(x − top), summed, then
			// divided by the sum.
			top := math.Inf(-1)
			for _, x := range row[:nk] {
				top = max(top, float64(x))
			}
			ex := ext[:nk]
			var z float64
			if r32, ok := any(row[:nk]).([]float32); ok && expShift64 != nil {
				expShift64(ex, r32, top)
				for _, e := range ex {
					z += e
				}
			} else {
				for j, x := range row[:nk] {
					ex[j] = math.Exp(float64(x) - top)
					z += ex[j]
				}
			}
			lse[bh*a.s+i] = T(top + math.Log(z))
			inv := 1 / z
			for j, e := range ex {
				row[j] = T(e * inv)
			}
		}
		clear(row[nk:])
	}
}

func attention[T float](a attnShape, mm matmul[T], o, lse, q, k, v []T, lo, hi int) {
	pr, ext := make([]T, a.s*a.t), make([]float64, a.t)
	for bh := lo; bh < hi; bh++ {
		scores(a, mm, pr, ext, q, k, lse, bh, false)
		// o = P·v
		mm(kernels.GemmParams{M: a.s, N: a.f, K: a.t, Alpha: 1, LDA: a.t, LDB: a.h * a.vs, LDC: a.h * a.f},
			pr, v[a.at(bh, a.t, 0, a.vs):], o[a.at(bh, a.s, 0, a.f):])
	}
}

// AttentionBackward implements kernels.Kernels.
func (p *Provider) AttentionBackward(dq, dk, dv, do, q, k, v, o, lse *tensor.Tensor, causal bool) error {
	if err := p.host(dq, dk, dv, do, q, k, v, o, lse); err != nil {
		return err
	}
	b, h, s, t, e, f, err := kernels.AttentionBackwardDims(dq, dk, dv, do, q, k, v, o, lse)
	if err != nil {
		return err
	}
	if q.DType() == tensor.BFloat16 {
		return p.widened(3, true, []*tensor.Tensor{dq, dk, dv, do, q, k, v, o, lse}, func(w []*tensor.Tensor) error {
			return p.AttentionBackward(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8], causal)
		})
	}
	a := newAttn(h, s, t, e, f, causal, k == nil)
	if q.DType() == tensor.Float32 {
		qq, kk, vv := splitQKV(a, q.Float32(), f32(k), f32(v))
		gq, gk, gv := splitQKV(a, dq.Float32(), f32(dk), f32(dv))
		mm := p.matmul32()
		p.inRows(b*h, 2*s*t*(e+f), func(lo, hi int) {
			attentionBackward(a, mm, gq, gk, gv, do.Float32(), qq, kk, vv, o.Float32(), lse.Float32(), lo, hi)
		})
	} else {
		qq, kk, vv := splitQKV(a, q.Float64(), f64(k), f64(v))
		gq, gk, gv := splitQKV(a, dq.Float64(), f64(dk), f64(dv))
		mm := p.matmul64()
		p.inRows(b*h, 2*s*t*(e+f), func(lo, hi int) {
			attentionBackward(a, mm, gq, gk, gv, do.Float64(), qq, kk, vv, o.Float64(), lse.Float64(), lo, hi)
		})
	}
	return nil
}

// attentionBackward, per batch and head, with P recomputed from lse:
// dv = Pᵀ·do, dP = do·vᵀ, dS = P ⊙ (dP − rowsum(do ⊙ o)) / √E, dq = dS·k,
// dk = dSᵀ·q.
func attentionBackward[T float](a attnShape, mm matmul[T], dq, dk, dv, do, q, k, v, o, lse []T, lo, hi int) {
	pr := make([]T, a.s*a.t)
	ds := make([]T, a.s*a.t)
	scale := 1 / math.Sqrt(float64(a.e))
	for bh := lo; bh < hi; bh++ {
		scores(a, mm, pr, nil, q, k, lse, bh, true)
		dob, ob := do[a.at(bh, a.s, 0, a.f):], o[a.at(bh, a.s, 0, a.f):]
		mm(kernels.GemmParams{TransA: true, M: a.t, N: a.f, K: a.s, Alpha: 1, LDA: a.t, LDB: a.h * a.f, LDC: a.h * a.vs},
			pr, dob, dv[a.at(bh, a.t, 0, a.vs):])
		mm(kernels.GemmParams{TransB: true, M: a.s, N: a.t, K: a.f, Alpha: 1, LDA: a.h * a.f, LDB: a.h * a.vs, LDC: a.t},
			dob, v[a.at(bh, a.t, 0, a.vs):], ds)
		for i := 0; i < a.s; i++ {
			di, oi := dob[i*a.h*a.f:][:a.f], ob[i*a.h*a.f:][:a.f]
			var dot float64
			for c := range di {
				dot += float64(di[c]) * float64(oi[c])
			}
			row, prow := ds[i*a.t:(i+1)*a.t], pr[i*a.t:(i+1)*a.t]
			for j := range row {
				row[j] = T(float64(prow[j]) * (float64(row[j]) - dot) * scale)
			}
		}
		mm(kernels.GemmParams{M: a.s, N: a.e, K: a.t, Alpha: 1, LDA: a.t, LDB: a.h * a.ks, LDC: a.h * a.qs},
			ds, k[a.at(bh, a.t, 0, a.ks):], dq[a.at(bh, a.s, 0, a.qs):])
		mm(kernels.GemmParams{TransA: true, M: a.t, N: a.e, K: a.s, Alpha: 1, LDA: a.t, LDB: a.h * a.qs, LDC: a.h * a.ks},
			ds, q[a.at(bh, a.s, 0, a.qs):], dk[a.at(bh, a.t, 0, a.ks):])
	}
}

// row is the local table row of id (held as a float), if this shard holds it.
func row[T float](id T, offset, rows int) (int, bool) {
	r := int(math.Round(float64(id))) - offset
	return r, r >= 0 && r < rows
}

// Embedding implements kernels.Kernels.
func (p *Provider) Embedding(y, ids, table *tensor.Tensor, offset int) error {
	if err := p.host(y, ids, table); err != nil {
		return err
	}
	n, rows, d, err := kernels.EmbeddingDims(y, ids, table)
	if err != nil {
		return err
	}
	if y.DType() == tensor.BFloat16 {
		return p.widened(1, false, []*tensor.Tensor{y, ids, table}, func(w []*tensor.Tensor) error { return p.Embedding(w[0], w[1], w[2], offset) })
	}
	if y.DType() == tensor.Float32 {
		p.inRows(n, d, func(lo, hi int) { embedding(y.Float32(), ids.Float32(), table.Float32(), offset, rows, d, lo, hi) })
	} else {
		p.inRows(n, d, func(lo, hi int) { embedding(y.Float64(), ids.Float64(), table.Float64(), offset, rows, d, lo, hi) })
	}
	return nil
}

func embedding[T float](y, ids, table []T, offset, rows, d, lo, hi int) {
	for i := lo; i < hi; i++ {
		if r, ok := row(ids[i], offset, rows); ok {
			copy(y[i*d:(i+1)*d], table[r*d:(r+1)*d])
		} else {
			clear(y[i*d : (i+1)*d])
		}
	}
}

// EmbeddingBackward implements kernels.Kernels.
func (p *Provider) EmbeddingBackward(dtable, dy, ids *tensor.Tensor, offset int, accumulate bool) error {
	if err := p.host(dtable, dy, ids); err != nil {
		return err
	}
	n, rows, d, err := kernels.EmbeddingDims(dy, ids, dtable)
	if err != nil {
		return err
	}
	if dtable.DType() == tensor.BFloat16 {
		return p.widened(1, false, []*tensor.Tensor{dtable, dy, ids}, func(w []*tensor.Tensor) error {
			return p.EmbeddingBackward(w[0], w[1], w[2], offset, accumulate)
		})
	}
	// Rows of the table are split over threads; every thread reads every id.
	if dtable.DType() == tensor.Float32 {
		p.inRows(rows, n, func(lo, hi int) {
			embeddingBackward(dtable.Float32(), dy.Float32(), ids.Float32(), offset, d, n, lo, hi, accumulate)
		})
	} else {
		p.inRows(rows, n, func(lo, hi int) {
			embeddingBackward(dtable.Float64(), dy.Float64(), ids.Float64(), offset, d, n, lo, hi, accumulate)
		})
	}
	return nil
}

func embeddingBackward[T float](dtable, dy, ids []T, offset, d, n, lo, hi int, accumulate bool) {
	if !accumulate {
		clear(dtable[lo*d : hi*d])
	}
	for i := 0; i < n; i++ {
		r, ok := row(ids[i], offset+lo, hi-lo)
		if !ok {
			continue
		}
		r += lo
		dst, src := dtable[r*d:(r+1)*d], dy[i*d:(i+1)*d]
		for c, g := range src {
			dst[c] += g
		}
	}
}

// CrossEntropy implements kernels.Kernels.
func (p *Provider) CrossEntropy(stats, logits, targets *tensor.Tensor, offset int) error {
	if err := p.host(stats, logits, targets); err != nil {
		return err
	}
	t, v, err := kernels.CrossEntropyDims(stats, logits, targets, 3)
	if err != nil {
		return err
	}
	if logits.DType() == tensor.BFloat16 {
		return p.widened(1, false, []*tensor.Tensor{stats, logits, targets}, func(w []*tensor.Tensor) error {
			return p.CrossEntropy(w[0], w[1], w[2], offset)
		})
	}
	if logits.DType() == tensor.Float32 {
		p.inRows(t, v, func(lo, hi int) {
			crossEntropy(stats.Float32(), logits.Float32(), targets.Float32(), offset, v, lo, hi)
		})
	} else {
		p.inRows(t, v, func(lo, hi int) {
			crossEntropy(stats.Float64(), logits.Float64(), targets.Float64(), offset, v, lo, hi)
		})
	}
	return nil
}

func crossEntropy[T float](stats, logits, targets []T, offset, v, lo, hi int) {
	var ex []float64 // the float32 rows' exponentials, where expShift64 is
	if _, ok := any(logits).([]float32); ok && expShift64 != nil {
		ex = make([]float64, v)
	}
	for i := lo; i < hi; i++ {
		l := logits[i*v : (i+1)*v]
		top := math.Inf(-1)
		for _, x := range l {
			top = max(top, float64(x))
		}
		var z float64
		if ex != nil {
			expShift64(ex, any(l).([]float32), top)
			for _, e := range ex {
				z += e
			}
		} else {
			for _, x := range l {
				z += math.Exp(float64(x) - top)
			}
		}
		var picked T
		if r, ok := row(targets[i], offset, v); ok {
			picked = l[r]
		}
		stats[3*i], stats[3*i+1], stats[3*i+2] = T(top), T(z), picked
	}
}

// CrossEntropyBackward implements kernels.Kernels.
func (p *Provider) CrossEntropyBackward(dlogits, logits, targets, lse *tensor.Tensor, offset int, scale float64) error {
	if err := p.host(dlogits, logits, targets, lse); err != nil {
		return err
	}
	t, v, err := kernels.CrossEntropyBackwardDims(dlogits, logits, targets, lse)
	if err != nil {
		return err
	}
	if logits.DType() == tensor.BFloat16 {
		return p.widened(1, false, []*tensor.Tensor{dlogits, logits, targets, lse}, func(w []*tensor.Tensor) error {
			return p.CrossEntropyBackward(w[0], w[1], w[2], w[3], offset, scale)
		})
	}
	if logits.DType() == tensor.Float32 {
		p.inRows(t, v, func(lo, hi int) {
			crossEntropyBackward(dlogits.Float32(), logits.Float32(), targets.Float32(), lse.Float32(), offset, v, lo, hi, scale)
		})
	} else {
		p.inRows(t, v, func(lo, hi int) {
			crossEntropyBackward(dlogits.Float64(), logits.Float64(), targets.Float64(), lse.Float64(), offset, v, lo, hi, scale)
		})
	}
	return nil
}

func crossEntropyBackward[T float](dl, logits, targets, lse []T, offset, v, lo, hi int, scale float64) {
	var ex []float64 // the float32 rows' exponentials, where expShift64 is
	if _, ok := any(logits).([]float32); ok && expShift64 != nil {
		ex = make([]float64, v)
	}
	for i := lo; i < hi; i++ {
		l, d := logits[i*v:(i+1)*v], dl[i*v:(i+1)*v]
		m := float64(lse[i])
		if ex != nil {
			expShift64(ex, any(l).([]float32), m)
			for j, e := range ex {
				d[j] = T(scale * e)
			}
		} else {
			for j, x := range l {
				d[j] = T(scale * math.Exp(float64(x)-m))
			}
		}
		if r, ok := row(targets[i], offset, v); ok {
			d[r] -= T(scale)
		}
	}
}

// CrossEntropyCombine implements kernels.Kernels: the whole rows'
// log-sum-exp from each shard's max and sum of exponentials, and the loss
// summed over rows in float64 in row order.
func (p *Provider) CrossEntropyCombine(lse, loss, stats *tensor.Tensor) error {
	if err := p.host(lse, loss, stats); err != nil {
		return err
	}
	parts, rows, err := kernels.CombineDims(lse, loss, stats)
	if err != nil {
		return err
	}
	if lse.DType() == tensor.Float32 {
		loss.Float64()[0] = combine(lse.Float32(), stats.Float32(), parts, rows)
	} else {
		loss.Float64()[0] = combine(lse.Float64(), stats.Float64(), parts, rows)
	}
	return nil
}

func combine[T float](lse, stats []T, parts, rows int) float64 {
	var loss float64
	for t := 0; t < rows; t++ {
		top := math.Inf(-1)
		for q := 0; q < parts; q++ {
			top = max(top, float64(stats[(q*rows+t)*3]))
		}
		var z, picked float64
		for q := 0; q < parts; q++ {
			st := stats[(q*rows+t)*3:]
			z += float64(st[1]) * math.Exp(float64(st[0])-top)
			picked += float64(st[2])
		}
		l := top + math.Log(z)
		lse[t] = T(l)
		loss += l - picked
	}
	return loss
}

// adamwK is AdamW's scalars as adamw32 takes them.
type adamwK struct{ w1, b2, omb2, decay, step, root, eps float32 }

// adamw32, where the machine has one, is AdamW's loop below in vector
// registers: the same operations in the same order, the same result.
var adamw32 func(p, g, m, v []float32, k *adamwK)

// AdamW implements kernels.Kernels: PyTorch's torch.optim.AdamW (decoupled
// weight decay, bias-corrected moments, eps added after the square root).
func (p *Provider) AdamW(a kernels.AdamWParams, param, grad, m, v *tensor.Tensor) error {
	if err := p.host(param, grad, m, v); err != nil {
		return err
	}
	n, err := kernels.AdamWDims(a, param, grad, m, v)
	if err != nil {
		return err
	}
	pw, gw, mw, vw := param.Float32(), grad.Float32(), m.Float32(), v.Float32()
	k := a.Scalars()
	decay, step, root, eps, w1, b2 := k.Decay, k.Step, k.Root, k.Eps, k.W1, k.B2
	inPieces(n, p.nthreads(), func(_, lo, hi int) {
		if adamw32 != nil {
			adamw32(pw[lo:hi], gw[lo:hi], mw[lo:hi], vw[lo:hi], &adamwK{w1, b2, 1 - b2, decay, step, root, eps})
			return
		}
		for i := lo; i < hi; i++ {
			g := gw[i]
			mi := mw[i] + w1*(g-mw[i]) // m.lerp_(g, 1 - β1)
			vi := b2*vw[i] + (1-b2)*g*g
			mw[i], vw[i] = mi, vi
			pw[i] *= decay
			pw[i] -= step * mi / (float32(math.Sqrt(float64(vi)))/root + eps)
		}
	})
	return nil
}
