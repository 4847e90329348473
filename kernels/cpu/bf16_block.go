package cpu

import (
	"unsafe"

	"github.com/meshrun/meshrun/tensor"
)

// The blocks of one bfloat16 GEMM job: packing A for the dot kernels, the
// epilogue of a whole output, and the dot, direct and packed paths over a
// block of C (see bf16.go for the paths and the engine that splits the job).

// packDotX splits the rows of A into groups for the dot kernels (4, 2, 1
// rows) and packs each into buf.a.
func (j *gemmJob16) packDotX(buf *packBuf16) {
	steps := (j.k + j.p.dotE - 1) / j.p.dotE
	j.groups = j.groups[:0]
	off := 0
	for i := 0; i < j.m; {
		g := 0
		for j.m-i < j.p.dots[g][0].r {
			g++
		}
		j.groups = append(j.groups, dotGroup{i, g, off})
		r := j.p.dots[g][0].r
		off += steps * r * 16
		i += r
	}
	buf.a = growPanel(buf.a, off)
	j.xpacked = buf.a
	for _, gr := range j.groups {
		r := j.p.dots[gr.g][0].r
		j.p.packX(j.xpacked[gr.off:], j.a[gr.i0*j.lda:], j.lda, r, j.k)
	}
}

// whole points ep at the output stage of g's output from element (i, j), for
// results of all of K: the final output, the beta term from g.in, the bias.
func (ep *epi16) whole(g *gemmArgs16, i, j int) {
	ep.alpha, ep.beta = g.alpha, g.beta
	ep.flags = 0
	ep.out, ep.ldOut = g.out.at(i, j), g.out.ld*g.out.size()
	if g.out.bf {
		ep.flags |= epiOutBF16
	}
	ep.in, ep.ldIn = nil, 0
	if g.beta != 0 {
		ep.in, ep.ldIn = g.in.at(i, j), g.in.ld*g.in.size()
		if g.in.bf {
			ep.flags |= epiInBF16
		}
	}
	ep.bias = nil
	if g.bias.valid() {
		ep.bias = g.bias.at(0, j)
		if g.bias.bf {
			ep.flags |= epiBiasBF16
		}
	}
}

func (j *gemmJob16) run(part int) {
	switch j.kind {
	case jobAxpy:
		c0, c1 := span(j.chunks, j.parts, part)
		for c := c0; c < c1; c++ {
			r0 := c * j.chunkRows
			r1 := min(j.k, r0+j.chunkRows)
			acc := j.partial[c*j.n : (c+1)*j.n]
			clear(acc)
			j.p.axpy(acc, j.a[r0:r1], j.b[r0*j.ldb:], j.ldb)
		}
		return
	case jobDot:
		c0, c1 := span((j.n+dotChunk-1)/dotChunk, j.parts, part)
		buf := bufPool16.get()
		j.dotBlock(buf, c0*dotChunk, min(c1*dotChunk, j.n))
		bufPool16.put(buf)
		return
	case jobDirect:
		buf := bufPool16.get()
		if j.splitN {
			t0, t1 := span((j.n+31)/32, j.parts, part)
			j.directBlock(buf, 0, j.m, t0*32, min(t1*32, j.n))
		} else {
			t0, t1 := span((j.m+7)/8, j.parts, part)
			j.directBlock(buf, t0*8, min(t1*8, j.m), 0, j.n)
		}
		bufPool16.put(buf)
		return
	}
	uk := j.uk
	i0, i1, j0, j1 := 0, j.m, 0, j.n
	if j.splitN {
		t0, t1 := span((j.n+uk.nr-1)/uk.nr, j.parts, part)
		j0, j1 = t0*uk.nr, min(t1*uk.nr, j.n)
	} else {
		t0, t1 := span((j.m+uk.mr-1)/uk.mr, j.parts, part)
		i0, i1 = t0*uk.mr, min(t1*uk.mr, j.m)
	}
	if i0 >= i1 || j0 >= j1 {
		return
	}
	buf := bufPool16.get()
	j.block(buf, i0, i1, j0, j1)
	bufPool16.put(buf)
}

// dotBlock computes columns [j0, j1) of the output with the dot kernels, in
// chunks of dotChunk columns: all rows of the chunk, then its output stage.
func (j *gemmJob16) dotBlock(buf *packBuf16, j0, j1 int) {
	buf.rows = grow(buf.rows, j.m*dotChunk)
	tmp := buf.rows
	e := &buf.e
	for c0 := j0; c0 < j1; c0 += dotChunk {
		cols := min(dotChunk, j1-c0)
		for _, gr := range j.groups {
			d := j.p.dots[gr.g]
			xp := (*bf16)(unsafe.Pointer(&j.xpacked[gr.off]))
			out := tmp[gr.i0*dotChunk:]
			c := 0
			for ; c+d[0].c <= cols; c += d[0].c {
				d[0].fn(j.k, xp, &j.b[(c0+c)*j.ldb], j.ldb, &out[c], dotChunk)
			}
			for ; c < cols; c++ {
				d[1].fn(j.k, xp, &j.b[(c0+c)*j.ldb], j.ldb, &out[c], dotChunk)
			}
		}
		e.whole(&j.gemmArgs16, 0, c0)
		j.p.epiRows(j.m, cols, tmp, dotChunk, e)
	}
}

// directMaxM is the largest M for which an untransposed B is read in place
// (measured: 2x the packed path at M = 8, 1.1x at 48, slower from 64).
var directMaxM = 48

// directMaxK is the largest K for which an untransposed B is read in place
// whatever M: the output stage dominates, and rows are written left to right
// (measured: 1.8x the packed path at K = 8, even at K = 12, slower from 14).
var directMaxK = 12

// directKC is the K block (rows of B) of the direct kernel with few rows of
// A: the rows of a block are walked tile after tile, so their pages stay in
// the TLB (rows of a large B are pages apart) and each row is a stream.
const directKC = 64

// directBlock computes out[i0:i1, j0:j1] with the direct kernel, 8×32 tiles,
// A packed in j.xpacked. With few rows of A (columns split), K is walked in
// blocks of directKC rows of B, all tiles of a block before the next, the sums
// kept in float32 between blocks (in the output itself if it is float32);
// otherwise (K small) all of K at once, row panels outer.
func (j *gemmJob16) directBlock(buf *packBuf16, i0, i1, j0, j1 int) {
	e := &buf.e
	e.alpha = j.alpha
	kp := (j.k + 1) / 2
	kcb := j.k
	if j.splitN {
		kcb = directKC
	}
	partial := j.out.bf && kcb < j.k
	var part mat16
	if partial {
		buf.part = growPanel(buf.part, (i1-i0)*(j1-j0))
		part = mat16{f32: buf.part, ld: j1 - j0}
	}
	var in, out, bias tileOperand
	for pc := 0; pc < j.k; pc += kcb {
		kc := min(kcb, j.k-pc)
		first, last := pc == 0, pc+kc == j.k
		in, e.beta = tileOperand{}, j.beta
		switch {
		case first && j.beta != 0:
			in = j.in.operand(i0, j0, epiInBF16)
		case !first && partial:
			in, e.beta = part.operand(0, 0, 0), 1
		case !first:
			in, e.beta = j.out.operand(i0, j0, epiInBF16), 1
		}
		if partial && !last {
			out = part.operand(0, 0, 0)
		} else {
			out = j.out.operand(i0, j0, epiOutBF16)
		}
		bias = tileOperand{}
		if first && j.bias.valid() {
			bias = j.bias.operand(0, j0, epiBiasBF16)
		}
		e.flags = in.flag | out.flag | bias.flag
		e.ldIn, e.ldOut = in.ld, out.ld
		tile := func(i, jj int) {
			e.bias = bias.at(0, jj-j0)
			e.in, e.out = in.at(i-i0, jj-j0), out.at(i-i0, jj-j0)
			j.p.direct(kc/2, &j.xpacked[i*kp+pc/2*8], &j.b[pc*j.ldb+jj], min(8, i1-i), uint64(1)<<min(32, j1-jj)-1, e, j.ldb, kc%2)
		}
		if j.splitN {
			for jj := j0; jj < j1; jj += 32 {
				for i := i0; i < i1; i += 8 {
					tile(i, jj)
				}
			}
		} else {
			for i := i0; i < i1; i += 8 {
				for jj := j0; jj < j1; jj += 32 {
					tile(i, jj)
				}
			}
		}
	}
	e.out, e.in, e.bias = nil, nil, nil
}

// block computes out[i0:i1, j0:j1] with the BLIS loop nest of gemmJob.block.
// With a bfloat16 output and several K blocks, the sums before the last block
// go to buf.part (float32, rows i0..i1 of the current column block).
func (j *gemmJob16) block(buf *packBuf16, i0, i1, j0, j1 int) {
	uk := j.uk
	mr, nr := uk.mr, uk.nr
	ncb := balance(j1-j0, uk.nc, nr)
	kcb := balance(j.k, uk.kc, 2)
	mcb := balance(i1-i0, uk.mc, mr)
	dcb := uk.depth(kcb)
	buf.b = growPanel(buf.b, dcb*ncb)
	buf.a = growPanel(buf.a, dcb*mcb)
	buf.tile = grow(buf.tile, mr*nr)
	partial := j.out.bf && kcb < j.k
	var part mat16
	if partial {
		buf.part = growPanel(buf.part, (i1-i0)*ncb)
		part = mat16{f32: buf.part, ld: ncb}
	}
	e := &buf.e
	e.tile = &buf.tile[0]
	e.alpha = j.alpha
	// Element (0, 0) of the block's output, beta term and bias, for this K
	// block; tiles offset them (in bytes).
	var out, in, bias tileOperand
	for jc := j0; jc < j1; jc += ncb {
		nc := min(ncb, j1-jc)
		for pc := 0; pc < j.k; pc += kcb {
			kc := min(kcb, j.k-pc)
			dc := uk.depth(kc)
			first, last := pc == 0, pc+kc == j.k
			// The beta term: C (or in) on the first K block, the running sum
			// after it; the output: C on the last block, else the running sum.
			in, e.beta = tileOperand{}, j.beta
			switch {
			case first && j.beta != 0:
				in = j.in.operand(i0, jc, epiInBF16)
			case !first && partial:
				in, e.beta = part.operand(0, 0, 0), 1
			case !first:
				in, e.beta = j.out.operand(i0, jc, epiInBF16), 1
			}
			if partial && !last {
				out = part.operand(0, 0, 0)
			} else {
				out = j.out.operand(i0, jc, epiOutBF16)
			}
			bias = tileOperand{}
			if first && j.bias.valid() {
				bias = j.bias.operand(0, jc, epiBiasBF16)
			}
			e.flags = in.flag | out.flag | bias.flag
			for ic := i0; ic < i1; ic += mcb {
				mc := min(mcb, i1-ic)
				uk.packA(buf.a, j.a, j.lda, j.transA, ic, mc, pc, kc, mr)
				for jr := 0; jr < nc; jr += nr {
					cols := min(nr, nc-jr)
					bp := buf.b[(jr/nr)*dc*nr:]
					if ic == i0 {
						uk.packB(bp, j.b, j.ldb, j.transB, pc, kc, jc+jr, cols, nr)
					}
					mask := uint64(1)<<cols - 1
					e.bias = bias.at(0, jr)
					for ir := 0; ir < mc; ir += mr {
						i := ic - i0 + ir
						e.in, e.ldIn = in.at(i, jr), in.ld
						e.out, e.ldOut = out.at(i, jr), out.ld
						uk.fn(dc, &buf.a[(ir/mr)*dc*mr], &bp[0], min(mr, mc-ir), mask, e)
					}
				}
			}
		}
	}
	e.out, e.in, e.bias, e.tile = nil, nil, nil, nil
}

// tileOperand is a matrix operand of the output stage seen from one element:
// tiles at (i, j) from it are ld·i + size·j bytes further.
type tileOperand struct {
	p        unsafe.Pointer
	ld, size int
	flag     uint64
}

// operand returns m from element (i, j), with flag set when m is bfloat16.
func (m *mat16) operand(i, j int, flag uint64) tileOperand {
	o := tileOperand{p: m.at(i, j), ld: m.ld * m.size(), size: m.size()}
	if m.bf {
		o.flag = flag
	}
	return o
}

func (o *tileOperand) at(i, j int) unsafe.Pointer {
	if o.p == nil {
		return nil
	}
	return unsafe.Add(o.p, i*o.ld+j*o.size)
}

// epiNoProduct is the output stage without a product (K = 0 or alpha = 0):
// out = bias + beta·in.
func epiNoProduct(g *gemmArgs16) {
	for i := 0; i < g.m; i++ {
		for j := 0; j < g.n; j++ {
			var v float32
			if g.bias.valid() {
				v = g.bias.get(0, j)
			}
			if g.beta != 0 {
				v += g.beta * g.in.get(i, j)
			}
			g.out.set(i, j, v)
		}
	}
}

func (m *mat16) get(i, j int) float32 {
	if m.bf {
		return m.b16[i*m.ld+j].Float32()
	}
	return m.f32[i*m.ld+j]
}

func (m *mat16) set(i, j int, v float32) {
	if m.bf {
		m.b16[i*m.ld+j] = tensor.ToBF16(v)
	} else {
		m.f32[i*m.ld+j] = v
	}
}
