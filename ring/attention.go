package ring

import (
	"context"
	"fmt"
	"math"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// Attention is one rank's ring attention on its share of the sequence:
// q [B, Sl, H, E], k [B, Sl, H, E], v [B, Sl, H, F] hold the positions of
// its chunks (Positions), one after the other; o [B, Sl, H, F] and lse
// [B, H, Sl] come out the same way. Tensors are float32 on the host.
type Attention struct {
	group   *collective.Group // nil: one rank
	gather  bool
	k       kernels.Kernels
	causal  bool
	b, h    int
	e, f    int
	me, cp  int
	chunks  [][]Chunk // every rank's
	q, kk   *tensor.Tensor
	v, o    *tensor.Tensor
	lse     *tensor.Tensor
	buf     [2][]float32 // the ring's two blocks (the one held, the one arriving)
	sent    int64
	peakKV  int64
	scratch map[string][]float32
}

// Config is a ring attention: the cp group (nil or one rank: no ring), the
// kernels, causal or not, the layout of the sequence, its length S, and
// the batch, heads and head dims (E for q and k, F for v).
type Config struct {
	Group      *collective.Group
	Kernels    kernels.Kernels
	Causal     bool
	Layout     Layout
	S, B, H    int
	E, F       int
	Rank, Size int // this rank's index in the cp group and the group's size (1 without a group)
	// Gather, instead of the ring, all-gathers every rank's keys and values
	// once and reduce-scatters their gradients back: what the planner picks
	// at short contexts, where a ring step's transfer costs more than its
	// compute hides. The rank holds the whole sequence's keys and values.
	Gather bool
}

// New builds the rank's ring attention.
func New(c Config) (*Attention, error) {
	cp := max(c.Size, 1)
	if c.Group != nil && c.Group.Size() != cp {
		return nil, fmt.Errorf("%w: a group of %d ranks for cp = %d", ErrShape, c.Group.Size(), cp)
	}
	if c.B < 1 || c.H < 1 || c.E < 1 || c.F < 1 {
		return nil, fmt.Errorf("%w: batch %d, heads %d, dims %d and %d", ErrShape, c.B, c.H, c.E, c.F)
	}
	chunks, err := Chunks(c.S, cp, c.Layout)
	if err != nil {
		return nil, err
	}
	a := &Attention{group: c.Group, gather: c.Gather, k: c.Kernels, causal: c.Causal, b: c.B, h: c.H, e: c.E, f: c.F, me: c.Rank, cp: cp,
		chunks: chunks, scratch: map[string][]float32{}}
	if cp == 1 {
		a.group = nil
	}
	return a, nil
}

// Local is this rank's chunks.
func (a *Attention) Local() []Chunk { return a.chunks[a.me] }

// Sent is the bytes this rank sent in the last Forward and Backward.
func (a *Attention) Sent() int64 { return a.sent }

// PeakKV is the most bytes of keys and values (and their gradients) the
// ring held at once besides the rank's own: the block computed with and
// the block arriving.
func (a *Attention) PeakKV() int64 { return a.peakKV }

// Bytes is the memory the attention keeps between its forward and its
// backward: its queries, keys, values, output and log-sum-exps, and the
// ring's blocks and scratch.
func (a *Attention) Bytes() int64 {
	var n int64
	for _, t := range []*tensor.Tensor{a.q, a.kk, a.v, a.o, a.lse} {
		if t != nil {
			n += int64(t.Bytes())
		}
	}
	for _, b := range a.buf {
		n += int64(4 * cap(b))
	}
	for _, b := range a.scratch {
		n += int64(4 * cap(b))
	}
	return n
}

// rows is how many positions rank r holds.
func (a *Attention) rows(r int) int { return Len(a.chunks[r]) }

// get returns a scratch slice of n floats kept under name.
func (a *Attention) get(name string, n int) []float32 {
	s := a.scratch[name]
	if cap(s) < n {
		s = make([]float32, n)
		a.scratch[name] = s
	}
	return s[:n]
}

// view is a host tensor over data.
func view(data []float32, shape ...int) *tensor.Tensor {
	t, err := tensor.FromFloat32(data[:tensor.NumElements(shape)], shape...)
	if err != nil {
		panic(err) // sizes computed here
	}
	return t
}

// rowsOf copies rows [at, at+n) of each batch of src [B, rows, w] into dst
// [B, n, w].
func rowsOf(dst, src []float32, b, rows, w, at, n int) {
	for i := range b {
		copy(dst[i*n*w:(i+1)*n*w], src[(i*rows+at)*w:(i*rows+at+n)*w])
	}
}

// addRows adds src [B, n, w] into rows [at, at+n) of each batch of dst
// [B, rows, w].
func addRows(dst, src []float32, b, rows, w, at, n int) {
	for i := range b {
		d, s := dst[(i*rows+at)*w:(i*rows+at+n)*w], src[i*n*w:(i+1)*n*w]
		for j, x := range s {
			d[j] += x
		}
	}
}

// pairs calls f for every chunk of this rank's queries and every chunk of
// owner's block that they see: causal: the chunks before (whole) and the
// same chunk (causal); else all.
func (a *Attention) pairs(owner int, f func(qi, qAt int, qc Chunk, ki, kAt int, kc Chunk, causal bool) error) error {
	qAt := 0
	for qi, qc := range a.chunks[a.me] {
		kAt := 0
		for ki, kc := range a.chunks[owner] {
			switch {
			case !a.causal || kc.Index < qc.Index:
				if err := f(qi, qAt, qc, ki, kAt, kc, false); err != nil {
					return err
				}
			case kc.Index == qc.Index:
				if err := f(qi, qAt, qc, ki, kAt, kc, true); err != nil {
					return err
				}
			}
			kAt += kc.Len
		}
		qAt += qc.Len
	}
	return nil
}

// check validates a rank's tensor [B, Sl, H, w].
func (a *Attention) check(name string, t *tensor.Tensor, w int) error {
	want := []int{a.b, a.rows(a.me), a.h, w}
	if t == nil || t.DType() != tensor.Float32 || !t.OnHost() || t.Rank() != 4 ||
		t.Dim(0) != want[0] || t.Dim(1) != want[1] || t.Dim(2) != want[2] || t.Dim(3) != want[3] {
		return fmt.Errorf("%w: %s is %v, want float32 %v on the host", ErrShape, name, t, want)
	}
	return nil
}

// exchange sends send to the next rank of the ring and receives what the
// previous one sends into recv, both at once; it returns a wait for them.
func (a *Attention) exchange(ctx context.Context, send, recv []float32) func() error {
	next, prev := (a.me+1)%a.cp, (a.me-1+a.cp)%a.cp
	errc := make(chan error, 2)
	go func() { errc <- collective.Send(ctx, a.group, send, next) }()
	go func() { errc <- collective.Recv(ctx, a.group, recv, prev) }()
	a.sent += int64(4 * len(send))
	return func() error {
		e1, e2 := <-errc, <-errc
		if e1 != nil {
			return e1
		}
		return e2
	}
}

// block is the size of owner's keys and values, packed: K [B, Sl, H, E]
// then V [B, Sl, H, F] (and, with grads, dK and dV after them).
func (a *Attention) block(owner int, grads bool) int {
	n := a.b * a.rows(owner) * a.h * (a.e + a.f)
	if grads {
		n *= 2
	}
	return n
}

// ring runs step(owner, block) for the blocks of every rank, the rank's own
// first, passing them around the ring; with grads the block carries the
// gradients, which step adds to, and the last step sends them home. It
// returns the rank's own block as it came back (with grads: its gradients).
func (a *Attention) ring(ctx context.Context, own []float32, grads bool, step func(owner int, blk []float32) error) ([]float32, error) {
	if a.gather && a.cp > 1 {
		return a.gathered(ctx, own, grads, step)
	}
	size := 0
	for r := range a.cp {
		size = max(size, a.block(r, grads))
	}
	for i := range a.buf {
		if cap(a.buf[i]) < size {
			a.buf[i] = make([]float32, size)
		}
	}
	cur := a.buf[0][:len(own)]
	copy(cur, own)
	a.peakKV = max(a.peakKV, int64(4*len(cur)))
	for j := range a.cp {
		owner := (a.me - j + a.cp) % a.cp
		var wait func() error
		var nxt []float32
		if j < a.cp-1 && !grads {
			// Keys and values do not change: pass them on while computing.
			nxt = a.buf[(j+1)%2][:a.block((owner-1+a.cp)%a.cp, grads)]
			wait = a.exchange(ctx, cur, nxt)
			a.peakKV = max(a.peakKV, int64(4*(len(cur)+len(nxt))))
		}
		if err := step(owner, cur); err != nil {
			if wait != nil {
				wait()
			}
			return nil, err
		}
		if grads && a.cp == 1 {
			return cur, nil
		}
		if grads {
			// The gradients are complete for this rank's part only now.
			nxt = a.buf[(j+1)%2][:a.block((owner-1+a.cp)%a.cp, grads)]
			if j == a.cp-1 {
				// Home: the gradients of the block go back to its owner
				// (the next rank); this rank's come from the previous one.
				half := a.block(owner, false)
				own := a.block(a.me, false)
				wait = a.exchange(ctx, cur[half:], nxt[:own])
				a.peakKV = max(a.peakKV, int64(4*(len(cur)+len(nxt))))
				if err := wait(); err != nil {
					return nil, err
				}
				return nxt[:own], nil
			}
			wait = a.exchange(ctx, cur, nxt)
			a.peakKV = max(a.peakKV, int64(4*(len(cur)+len(nxt))))
		}
		if wait != nil {
			if err := wait(); err != nil {
				return nil, err
			}
			cur = nxt
		}
	}
	return cur, nil
}

// Forward computes o and lse for the rank's queries against every rank's
// keys and values (q, k, v are kept for Backward).
func (a *Attention) Forward(ctx context.Context, q, k, v *tensor.Tensor) (o, lse *tensor.Tensor, err error) {
	if err := a.check("q", q, a.e); err != nil {
		return nil, nil, err
	}
	if err := a.check("k", k, a.e); err != nil {
		return nil, nil, err
	}
	if err := a.check("v", v, a.f); err != nil {
		return nil, nil, err
	}
	a.sent, a.peakKV = 0, 0
	a.q, a.kk, a.v = q, k, v
	b, h, e, f, sl := a.b, a.h, a.e, a.f, a.rows(a.me)
	o, lse = tensor.New(tensor.Float32, b, sl, h, f), tensor.New(tensor.Float32, b, h, sl)
	ls := lse.Float32()
	for i := range ls {
		ls[i] = float32(math.Inf(-1))
	}
	own := a.get("own", a.block(a.me, false))
	copy(own, k.Float32())
	copy(own[len(k.Float32()):], v.Float32())
	qd := q.Float32()
	_, err = a.ring(ctx, own, false, func(owner int, blk []float32) error {
		rows := a.rows(owner)
		kb, vb := blk[:b*rows*h*e], blk[b*rows*h*e:a.block(owner, false)]
		return a.pairs(owner, func(_, qAt int, qc Chunk, _, kAt int, kc Chunk, causal bool) error {
			qt := view(a.get("qc", b*qc.Len*h*e), b, qc.Len, h, e)
			rowsOf(qt.Float32(), qd, b, sl, h*e, qAt, qc.Len)
			kt := view(a.get("kc", b*kc.Len*h*e), b, kc.Len, h, e)
			rowsOf(kt.Float32(), kb, b, rows, h*e, kAt, kc.Len)
			vt := view(a.get("vc", b*kc.Len*h*f), b, kc.Len, h, f)
			rowsOf(vt.Float32(), vb, b, rows, h*f, kAt, kc.Len)
			ot := view(a.get("oc", b*qc.Len*h*f), b, qc.Len, h, f)
			lt := view(a.get("lc", b*h*qc.Len), b, h, qc.Len)
			if err := a.k.Attention(ot, lt, qt, kt, vt, causal); err != nil {
				return err
			}
			merge(o.Float32(), ls, ot.Float32(), lt.Float32(), b, sl, h, f, qAt, qc.Len)
			return nil
		})
	})
	if err != nil {
		return nil, nil, err
	}
	a.o, a.lse = o, lse
	return o, lse, nil
}

// merge folds a partial result (po [B, n, H, F], plse [B, H, n], for rows
// [at, at+n) of the rank's queries) into o [B, sl, H, F] and lse [B, H,
// sl] by the log-sum-exp.
func merge(o, lse, po, plse []float32, b, sl, h, f, at, n int) {
	for bi := range b {
		for hi := range h {
			for i := range n {
				li := (bi*h+hi)*sl + at + i
				pl := float64(plse[(bi*h+hi)*n+i])
				old := float64(lse[li])
				m := math.Max(old, pl)
				if math.IsInf(m, -1) {
					continue
				}
				nl := m + math.Log(math.Exp(old-m)+math.Exp(pl-m))
				wo, wp := float32(math.Exp(old-nl)), float32(math.Exp(pl-nl))
				orow := o[((bi*sl+at+i)*h+hi)*f:][:f]
				prow := po[((bi*n+i)*h+hi)*f:][:f]
				for c := range orow {
					orow[c] = wo*orow[c] + wp*prow[c]
				}
				lse[li] = float32(nl)
			}
		}
	}
}

// Backward computes dq, dk and dv for do, the gradient of the last
// Forward's o.
func (a *Attention) Backward(ctx context.Context, do *tensor.Tensor) (dq, dk, dv *tensor.Tensor, err error) {
	if a.o == nil {
		return nil, nil, nil, fmt.Errorf("%w: Backward without a Forward", ErrShape)
	}
	if err := a.check("do", do, a.f); err != nil {
		return nil, nil, nil, err
	}
	b, h, e, f, sl := a.b, a.h, a.e, a.f, a.rows(a.me)
	dq = tensor.New(tensor.Float32, b, sl, h, e)
	own := a.get("own", a.block(a.me, true))
	clear(own)
	kv := a.block(a.me, false)
	copy(own, a.kk.Float32())
	copy(own[len(a.kk.Float32()):], a.v.Float32())
	qd, od, dod, ld := a.q.Float32(), a.o.Float32(), do.Float32(), a.lse.Float32()
	back, err := a.ring(ctx, own[:2*kv], true, func(owner int, blk []float32) error {
		rows := a.rows(owner)
		half := a.block(owner, false)
		kb, vb := blk[:b*rows*h*e], blk[b*rows*h*e:half]
		dkb, dvb := blk[half:half+b*rows*h*e], blk[half+b*rows*h*e:2*half]
		return a.pairs(owner, func(_, qAt int, qc Chunk, _, kAt int, kc Chunk, causal bool) error {
			qt := view(a.get("qc", b*qc.Len*h*e), b, qc.Len, h, e)
			rowsOf(qt.Float32(), qd, b, sl, h*e, qAt, qc.Len)
			ot := view(a.get("oc", b*qc.Len*h*f), b, qc.Len, h, f)
			rowsOf(ot.Float32(), od, b, sl, h*f, qAt, qc.Len)
			dot := view(a.get("doc", b*qc.Len*h*f), b, qc.Len, h, f)
			rowsOf(dot.Float32(), dod, b, sl, h*f, qAt, qc.Len)
			lt := view(a.get("lc", b*h*qc.Len), b, h, qc.Len)
			rowsOf(lt.Float32(), ld, b*h, sl, 1, qAt, qc.Len)
			kt := view(a.get("kc", b*kc.Len*h*e), b, kc.Len, h, e)
			rowsOf(kt.Float32(), kb, b, rows, h*e, kAt, kc.Len)
			vt := view(a.get("vc", b*kc.Len*h*f), b, kc.Len, h, f)
			rowsOf(vt.Float32(), vb, b, rows, h*f, kAt, kc.Len)
			dqt := view(a.get("dqc", b*qc.Len*h*e), b, qc.Len, h, e)
			dkt := view(a.get("dkc", b*kc.Len*h*e), b, kc.Len, h, e)
			dvt := view(a.get("dvc", b*kc.Len*h*f), b, kc.Len, h, f)
			if err := a.k.AttentionBackward(dqt, dkt, dvt, dot, qt, kt, vt, ot, lt, causal); err != nil {
				return err
			}
			addRows(dq.Float32(), dqt.Float32(), b, sl, h*e, qAt, qc.Len)
			addRows(dkb, dkt.Float32(), b, rows, h*e, kAt, kc.Len)
			addRows(dvb, dvt.Float32(), b, rows, h*f, kAt, kc.Len)
			return nil
		})
	})
	if err != nil {
		return nil, nil, nil, err
	}
	// One rank: the block never left, its gradients follow its keys and
	// values; else back holds just the gradients.
	if a.cp == 1 {
		back = back[kv:]
	}
	dk = tensor.New(tensor.Float32, b, sl, h, e)
	dv = tensor.New(tensor.Float32, b, sl, h, f)
	copy(dk.Float32(), back[:b*sl*h*e])
	copy(dv.Float32(), back[b*sl*h*e:kv])
	return dq, dk, dv, nil
}

// gathered is ring's work without the ring: every rank's block all-gathered
// at once, step run on each, and with grads the blocks' gradients
// reduce-scattered back to their owners.
func (a *Attention) gathered(ctx context.Context, own []float32, grads bool, step func(owner int, blk []float32) error) ([]float32, error) {
	counts, offs := make([]int, a.cp), make([]int, a.cp+1)
	for r := range a.cp {
		counts[r] = a.block(r, false)
		offs[r+1] = offs[r] + counts[r]
	}
	kv := a.get("gathered", offs[a.cp])
	if err := collective.AllGather(ctx, a.group, own[:counts[a.me]], kv, counts); err != nil {
		return nil, err
	}
	a.sent += int64(4 * counts[a.me] * (a.cp - 1))
	held := int64(4 * len(kv))
	var grad []float32
	if grads {
		grad = a.get("gathered grads", offs[a.cp])
		clear(grad)
		held *= 2
	}
	a.peakKV = max(a.peakKV, held)
	blk := a.get("gathered block", 2*a.block(a.me, false)+2*offs[a.cp])
	for r := range a.cp {
		n := counts[r]
		b := blk[:n]
		if grads {
			b = blk[:2*n]
			clear(b[n:])
		}
		copy(b, kv[offs[r]:offs[r+1]])
		if err := step(r, b); err != nil {
			return nil, err
		}
		if grads {
			copy(grad[offs[r]:offs[r+1]], b[n:])
		}
	}
	if !grads {
		return own, nil
	}
	mine := make([]float32, counts[a.me])
	if err := collective.ReduceScatter(ctx, a.group, grad, mine, counts, collective.Sum); err != nil {
		return nil, err
	}
	a.sent += int64(4 * (offs[a.cp] - counts[a.me]))
	return mine, nil
}
