package moe

import (
	"context"
	"fmt"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// forward is what one forward keeps for its backward.
type forward struct {
	r *routing
	// send and recv are the token rows per ep rank (send: this rank's kept
	// slots to each; recv: the rows each sends this rank), rows the rows per
	// local expert, fromRows[i·el+x] the rows source i sends to local expert x.
	send, recv, rows, fromRows []int
	xe, pre, h                 *tensor.Tensor // [R,H], [R,Fl], [R,Fl]: expert-major
	x                          *tensor.Tensor // the input (kept until the backward)
	ys                         []float32      // [S,H]: the experts' outputs per kept slot, send order
	ysBuf                      []float32
	f                          []float64 // per expert: its share of the T·k slots
	stats                      Stats
}

// Forward runs the layer on this rank's tokens x [tl, H] (a tensor of the
// device) and returns y [tl, H] and the routing's statistics. Every rank of the
// mesh must call it.
func (l *Layer) Forward(ctx context.Context, w *collective.World, x *tensor.Tensor) (*tensor.Tensor, Stats, error) {
	s := l.Plan.Shape
	if x.DType() != tensor.Float32 || x.Rank() != 2 || x.Dim(0) != l.tl || x.Dim(1) != s.H {
		return nil, Stats{}, fmt.Errorf("%w: x is %v, want float32 [%d %d]", ErrConfig, x, l.tl, s.H)
	}
	l.Executed = l.Executed[:0]
	fw := &forward{x: x}
	l.fwd = nil
	// The router, on the device; the top-k on the host.
	logits, err := l.scratch("logits", l.tl, s.E)
	if err != nil {
		return nil, Stats{}, err
	}
	if err := kernels.LinearForward(l.k, logits, x, l.Router, nil); err != nil {
		return nil, Stats{}, err
	}
	var lbuf []float32
	lh, err := host(logits, &lbuf)
	if err != nil {
		return nil, Stats{}, err
	}
	if fw.r, err = route(lh, l.tl, s.E, s.K, l.tok0); err != nil {
		return nil, Stats{}, err
	}
	before, err := l.statistics(ctx, w, fw)
	if err != nil {
		return nil, Stats{}, err
	}
	fw.r.keep(s.MoECapacity(), before)
	if err := l.dispatchForward(ctx, w, fw, x); err != nil {
		return nil, Stats{}, err
	}
	y, err := l.combine(fw)
	if err != nil {
		return nil, Stats{}, err
	}
	l.fwd = fw
	return y, fw.stats, nil
}

// statistics all-gathers the routing's counts and probability sums over the
// ranks holding other tokens, computes the aux loss and the counts, and
// returns per expert the slots routed to it by tokens before this rank's.
func (l *Layer) statistics(ctx context.Context, w *collective.World, fw *forward) ([]int, error) {
	s, r := l.Plan.Shape, fw.r
	n := 2*s.E + 2
	mine := make([]float64, n)
	for e := range s.E {
		mine[e], mine[s.E+e] = float64(r.routed[e]), r.psum[e]
	}
	mine[2*s.E], mine[2*s.E+1] = float64(l.tok0), float64(l.tl)
	all := mine
	if dims := l.Plan.TokenDims(); l.Plan.GroupSize(dims) > 1 {
		g, err := l.group(ctx, w, dims)
		if err != nil {
			return nil, err
		}
		all = make([]float64, n*g.Size())
		counts := make([]int, g.Size())
		for i := range counts {
			counts[i] = n
		}
		if err := collective.AllGather(ctx, g, mine, all, counts); err != nil {
			return nil, err
		}
		l.record("forward", "top-k", "all_gather", "routing", dims, int64(8*n*(g.Size()-1)))
	}
	before := make([]int, s.E)
	routed, psum := make([]int, s.E), make([]float64, s.E)
	for m := 0; m < len(all); m += n {
		row := all[m : m+n]
		for e := range s.E {
			routed[e] += int(row[e])
			psum[e] += row[s.E+e]
			if row[2*s.E] < float64(l.tok0) {
				before[e] += int(row[e])
			}
		}
	}
	st := Stats{Routed: routed, Tokens: make([]int, s.E)}
	c, slots := s.MoECapacity(), float64(s.T*s.K)
	fw.f = make([]float64, s.E)
	for e := range s.E {
		st.Tokens[e] = routed[e]
		if c > 0 {
			st.Tokens[e] = min(routed[e], c)
		}
		st.Dropped += routed[e] - st.Tokens[e]
		fw.f[e] = float64(routed[e]) / slots
		st.Aux += fw.f[e] * psum[e] / float64(s.T)
	}
	st.Aux *= float64(s.E)
	fw.stats = st
	return before, nil
}

// exchangeCounts is the dispatch's first phase: every rank tells each ep
// rank how many rows it sends to each of its experts.
func (l *Layer) exchangeCounts(ctx context.Context, w *collective.World, fw *forward) error {
	pl, r := l.Plan, fw.r
	ep := pl.Size(pl.EP)
	fw.send, fw.recv, fw.rows = make([]int, ep), make([]int, ep), make([]int, l.el)
	fw.fromRows = make([]int, ep*l.el)
	for e, c := range r.count {
		fw.send[pl.ExpertOwner(e)] += c
	}
	if ep == 1 {
		copy(fw.fromRows, r.count)
	} else {
		g, err := l.group(ctx, w, []int{pl.EP})
		if err != nil {
			return err
		}
		send := make([]float64, pl.Shape.E)
		sc, rc := make([]int, ep), make([]int, ep)
		for e, c := range r.count {
			send[e] = float64(c)
			sc[pl.ExpertOwner(e)]++
		}
		for i := range rc {
			rc[i] = l.el
		}
		recv := make([]float64, ep*l.el)
		if err := collective.AllToAll(ctx, g, send, sc, recv, rc); err != nil {
			return err
		}
		l.record("forward", "dispatch", "all_to_all", "counts", []int{pl.EP}, int64(8*(pl.Shape.E-l.el)))
		for i, v := range recv {
			fw.fromRows[i] = int(v)
		}
	}
	for i := range ep {
		for x := range l.el {
			c := fw.fromRows[i*l.el+x]
			fw.recv[i] += c
			fw.rows[x] += c
		}
	}
	return nil
}

// exchange sends rows [Σ counts, H] of src (per ep rank: counts) and returns
// the rows received (per ep rank: back), in dst; it records the collective.
func (l *Layer) exchange(ctx context.Context, w *collective.World, phase, op, name string, src *tensor.Tensor, counts []int, dst *tensor.Tensor, back []int) (int64, error) {
	pl, h := l.Plan, l.Plan.Shape.H
	ep := pl.Size(pl.EP)
	if ep == 1 {
		return 0, copyRows(dst, 0, src, 0, counts[0], h)
	}
	c, err := l.comm(ctx, w, []int{pl.EP})
	if err != nil {
		return 0, err
	}
	sc, rc := make([]int, ep), make([]int, ep)
	var bytes int64
	me := pl.Coord(w.Rank(), pl.EP)
	for i := range ep {
		sc[i], rc[i] = counts[i]*h, back[i]*h
		if i != me {
			bytes += int64(4 * sc[i])
		}
	}
	if err := c.AllToAll(ctx, src, sc, dst, rc); err != nil {
		return 0, err
	}
	l.record(phase, op, "all_to_all", name, []int{pl.EP}, bytes)
	return bytes, nil
}

// reorder moves rows between source-major order (each ep rank's rows, by
// expert) and expert-major order (each local expert's rows, by source).
func (l *Layer) reorder(fw *forward, dst, src *tensor.Tensor, toExpert bool, width int) error {
	ep := len(fw.recv)
	start := make([]int, l.el) // each expert's next row, expert-major
	for x := 1; x < l.el; x++ {
		start[x] = start[x-1] + fw.rows[x-1]
	}
	at := 0 // source-major row
	for i := range ep {
		for x := range l.el {
			n := fw.fromRows[i*l.el+x]
			var err error
			if toExpert {
				err = copyRows(dst, start[x], src, at, n, width)
			} else {
				err = copyRows(dst, at, src, start[x], n, width)
			}
			if err != nil {
				return err
			}
			start[x] += n
			at += n
		}
	}
	return nil
}

// allReduceTP sums t over tp (its partial sums of the split FFN).
func (l *Layer) allReduceTP(ctx context.Context, w *collective.World, phase, name string, t *tensor.Tensor) error {
	pl := l.Plan
	tp := pl.Size(pl.TP)
	if tp == 1 {
		return nil
	}
	c, err := l.comm(ctx, w, []int{pl.TP})
	if err != nil {
		return err
	}
	if err := c.AllReduce(ctx, t, collective.Sum); err != nil {
		return err
	}
	l.record(phase, "experts", "all_reduce", name, []int{pl.TP}, int64(2*t.Bytes()*(tp-1)/tp))
	return nil
}

// dispatchForward sends the kept slots' rows to their experts, runs the
// experts and brings their outputs back into fw.ys (send order).
func (l *Layer) dispatchForward(ctx context.Context, w *collective.World, fw *forward, x *tensor.Tensor) error {
	pl, s := l.Plan, l.Plan.Shape
	if err := l.exchangeCounts(ctx, w, fw); err != nil {
		return err
	}
	nsend, nrecv := len(fw.r.order), sum(fw.recv)
	xs, err := l.scratch("xs", nsend, s.H)
	if err != nil {
		return err
	}
	for i, slot := range fw.r.order {
		if err := copyRows(xs, i, x, slot/s.K, 1, s.H); err != nil {
			return err
		}
	}
	xr, err := l.scratch("xr", nrecv, s.H)
	if err != nil {
		return err
	}
	sent, err := l.exchange(ctx, w, "forward", "dispatch", "x", xs, fw.send, xr, fw.recv)
	if err != nil {
		return err
	}
	fl := l.W1.Dim(1)
	if fw.xe, err = l.scratch("xe", nrecv, s.H); err != nil {
		return err
	}
	if fw.pre, err = l.scratch("pre", nrecv, fl); err != nil {
		return err
	}
	if fw.h, err = l.scratch("h", nrecv, fl); err != nil {
		return err
	}
	oe, err := l.scratch("oe", nrecv, s.H)
	if err != nil {
		return err
	}
	if err := l.reorder(fw, fw.xe, xr, true, s.H); err != nil {
		return err
	}
	if err := kernels.GroupedLinearForwardGelu(l.k, fw.rows, fw.h, fw.pre, fw.xe, l.W1, l.B1); err != nil {
		return err
	}
	b2 := l.B2
	if pl.Coord(l.rank, pl.TP) != 0 {
		b2 = nil // the sum over tp adds it once
	}
	if err := kernels.GroupedLinearForward(l.k, fw.rows, oe, fw.h, l.W2, b2); err != nil {
		return err
	}
	if err := l.allReduceTP(ctx, w, "forward", "y_experts", oe); err != nil {
		return err
	}
	if err := l.reorder(fw, xr, oe, false, s.H); err != nil {
		return err
	}
	ys, err := l.scratch("ys", nsend, s.H)
	if err != nil {
		return err
	}
	back, err := l.exchange(ctx, w, "forward", "combine", "y", xr, fw.recv, ys, fw.send)
	if err != nil {
		return err
	}
	fw.stats.DispatchBytes = sent + back
	fw.ys, err = host(ys, &fw.ysBuf)
	return err
}

// combine sums each token's kept slots' outputs weighted by their gates.
func (l *Layer) combine(fw *forward) (*tensor.Tensor, error) {
	h, k, r := l.Plan.Shape.H, l.Plan.Shape.K, fw.r
	y, err := l.scratch("y", l.tl, h)
	if err != nil {
		return nil, err
	}
	var buf []float32
	yh, err := host(y, &buf)
	if err != nil {
		return nil, err
	}
	clear(yh)
	for t := range l.tl {
		row := yh[t*h : (t+1)*h]
		for j := range k {
			p := r.pos[t*k+j]
			if p < 0 {
				continue
			}
			g := float32(r.gate[t*k+j])
			for i, v := range fw.ys[p*h : (p+1)*h] {
				row[i] += g * v
			}
		}
	}
	return y, store(y, yh)
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// Backward runs the backward of the last Forward for dy [tl, H], the
// gradient of the objective with respect to y (the aux loss's coefficient is
// Config.AuxCoef): it returns dx [tl, H] and leaves the parameters'
// gradients, reduced over the mesh, in DRouter, DW1, DB1, DW2 and DB2.
func (l *Layer) Backward(ctx context.Context, w *collective.World, dy *tensor.Tensor) (*tensor.Tensor, error) {
	s, fw := l.Plan.Shape, l.fwd
	if fw == nil {
		return nil, fmt.Errorf("%w: Backward without a Forward", ErrConfig)
	}
	if dy.DType() != tensor.Float32 || dy.Rank() != 2 || dy.Dim(0) != l.tl || dy.Dim(1) != s.H {
		return nil, fmt.Errorf("%w: dy is %v, want float32 [%d %d]", ErrConfig, dy, l.tl, s.H)
	}
	r, h, k := fw.r, s.H, s.K
	var dbuf []float32
	dyh, err := host(dy, &dbuf)
	if err != nil {
		return nil, err
	}
	// The combine's backward: the rows' gradients and the gates'.
	nsend, nrecv := len(r.order), sum(fw.recv)
	dys, err := l.scratch("xs", nsend, h)
	if err != nil {
		return nil, err
	}
	var sbuf []float32
	dysh, err := host(dys, &sbuf)
	if err != nil {
		return nil, err
	}
	dgate := make([]float64, l.tl*k)
	for t := range l.tl {
		g := dyh[t*h : (t+1)*h]
		for j := range k {
			p := r.pos[t*k+j]
			if p < 0 {
				continue
			}
			gate, out := float32(r.gate[t*k+j]), dysh[p*h:(p+1)*h]
			var dot float64
			for i, v := range fw.ys[p*h : (p+1)*h] {
				dot += float64(g[i]) * float64(v)
				out[i] = gate * g[i]
			}
			dgate[t*k+j] = dot
		}
	}
	if err := store(dys, dysh); err != nil {
		return nil, err
	}
	dyr, err := l.scratch("xr", nrecv, h)
	if err != nil {
		return nil, err
	}
	if _, err := l.exchange(ctx, w, "backward", "combine", "dy", dys, fw.send, dyr, fw.recv); err != nil {
		return nil, err
	}
	dxs, err := l.experts(ctx, w, fw, dyr)
	if err != nil {
		return nil, err
	}
	dx, err := l.routerBackward(ctx, w, fw, dgate, dxs)
	if err != nil {
		return nil, err
	}
	if err := l.reduceGrads(ctx, w); err != nil {
		return nil, err
	}
	return dx, nil
}

// experts runs the experts' backward on the output gradients received (dyr,
// source-major), writes the weights' gradients and returns the input
// gradients sent back, per kept slot in send order.
func (l *Layer) experts(ctx context.Context, w *collective.World, fw *forward, dyr *tensor.Tensor) (*tensor.Tensor, error) {
	h, nrecv := l.Plan.Shape.H, sum(fw.recv)
	dye, err := l.scratch("oe", nrecv, h)
	if err != nil {
		return nil, err
	}
	if err := l.reorder(fw, dye, dyr, true, h); err != nil {
		return nil, err
	}
	if err := kernels.GroupedLinearBackwardWeight(l.k, fw.rows, l.DW2, l.DB2, dye, fw.h, false); err != nil {
		return nil, err
	}
	dpre, err := l.scratch("dpre", nrecv, l.W1.Dim(1))
	if err != nil {
		return nil, err
	}
	if err := kernels.GroupedLinearBackwardInputGelu(l.k, fw.rows, dpre, l.DB1, dye, l.W2, fw.pre); err != nil {
		return nil, err
	}
	if err := kernels.GroupedLinearBackwardWeight(l.k, fw.rows, l.DW1, nil, dpre, fw.xe, false); err != nil {
		return nil, err
	}
	dxe, err := l.scratch("dxe", nrecv, h)
	if err != nil {
		return nil, err
	}
	if err := kernels.GroupedLinearBackwardInput(l.k, fw.rows, dxe, dpre, l.W1); err != nil {
		return nil, err
	}
	if err := l.allReduceTP(ctx, w, "backward", "dx_experts", dxe); err != nil {
		return nil, err
	}
	if err := l.reorder(fw, dyr, dxe, false, h); err != nil {
		return nil, err
	}
	dxs, err := l.scratch("xs", len(fw.r.order), h)
	if err != nil {
		return nil, err
	}
	if _, err := l.exchange(ctx, w, "backward", "dispatch", "dx", dyr, fw.recv, dxs, fw.send); err != nil {
		return nil, err
	}
	return dxs, nil
}

// routerBackward computes the router's gradient (reduced over the tokens'
// ranks) and returns dx: the router's part plus each kept slot's input
// gradient dxs, summed per token.
func (l *Layer) routerBackward(ctx context.Context, w *collective.World, fw *forward, dgate []float64, dxs *tensor.Tensor) (*tensor.Tensor, error) {
	pl, s, r := l.Plan, l.Plan.Shape, fw.r
	daux := make([]float64, s.E)
	for e := range daux {
		daux[e] = l.AuxCoef * float64(s.E) * fw.f[e] / float64(s.T)
	}
	dl, err := l.scratch("dlogits", l.tl, s.E)
	if err != nil {
		return nil, err
	}
	var lbuf []float32
	dlh, err := host(dl, &lbuf)
	if err != nil {
		return nil, err
	}
	r.gradLogits(dgate, daux, dlh)
	if err := store(dl, dlh); err != nil {
		return nil, err
	}
	if err := kernels.LinearBackwardWeight(l.k, l.DRouter, dl, fw.x, false); err != nil {
		return nil, err
	}
	dx, err := l.scratch("dx", l.tl, s.H)
	if err != nil {
		return nil, err
	}
	if err := kernels.LinearBackwardInput(l.k, dx, dl, l.Router); err != nil {
		return nil, err
	}
	var xbuf, sbuf []float32
	dxh, err := host(dx, &xbuf)
	if err != nil {
		return nil, err
	}
	dxsh, err := host(dxs, &sbuf)
	if err != nil {
		return nil, err
	}
	h := s.H
	for i, slot := range r.order {
		row := dxh[(slot/s.K)*h : (slot/s.K+1)*h]
		for j, v := range dxsh[i*h : (i+1)*h] {
			row[j] += v
		}
	}
	if err := store(dx, dxh); err != nil {
		return nil, err
	}
	if dims := pl.TokenDims(); len(dims) > 0 && l.Plan.GroupSize(dims) > 1 {
		c, err := l.comm(ctx, w, dims)
		if err != nil {
			return nil, err
		}
		if err := c.AllReduce(ctx, l.DRouter, collective.Sum); err != nil {
			return nil, err
		}
		n := l.Plan.GroupSize(dims)
		l.record("backward", "router", "all_reduce", "drouter", dims, int64(2*l.DRouter.Bytes()*(n-1)/n))
	}
	return dx, nil
}

// reduceGrads sums the experts' gradients over dp.
func (l *Layer) reduceGrads(ctx context.Context, w *collective.World) error {
	pl := l.Plan
	dp := pl.Size(pl.DP)
	if dp == 1 {
		return nil
	}
	c, err := l.comm(ctx, w, []int{pl.DP})
	if err != nil {
		return err
	}
	for _, g := range []struct {
		name string
		t    *tensor.Tensor
	}{{"dw1", l.DW1}, {"db1", l.DB1}, {"dw2", l.DW2}, {"db2", l.DB2}} {
		if err := c.AllReduce(ctx, g.t, collective.Sum); err != nil {
			return err
		}
		l.record("backward", "experts", "all_reduce", g.name, []int{pl.DP}, int64(2*g.t.Bytes()*(dp-1)/dp))
	}
	return nil
}
