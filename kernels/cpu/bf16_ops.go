package cpu

import (
	"fmt"
	"sync"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// matOf views a host float32 or bfloat16 tensor as a matrix of leading dim ld.
func matOf(t *tensor.Tensor, ld int) mat16 {
	if t == nil {
		return mat16{}
	}
	if t.DType() == tensor.BFloat16 {
		return mat16{b16: t.BFloat16(), ld: ld, bf: true}
	}
	return mat16{f32: t.Float32(), ld: ld}
}

// scratch32 is pooled float32 working memory (epilogue results, sums).
type scratch32 struct{ s []float32 }

var scratchPool freeList[scratch32]

// gemm16 runs a checked bfloat16 GEMM and its epilogue. The output stage of the
// GEMM applies alpha, beta and the bias; the other epilogues work on float32
// results: with a float32 C in C itself (as for float32 GEMMs), with a
// bfloat16 C in a float32 scratch, from which C, Aux and Bias are each rounded
// once.
func (p *Provider) gemm16(g kernels.GemmParams, o kernels.GemmOperands, t int) {
	e := &p.e16
	m, n := g.M, g.N
	c := matOf(o.C, g.LDC)
	args := gemmArgs16{transA: g.TransA, transB: g.TransB, m: m, n: n, k: g.K,
		alpha: float32(g.Alpha), beta: float32(g.Beta), a: o.A.BFloat16(), b: o.B.BFloat16(),
		lda: g.LDA, ldb: g.LDB, in: c, out: c}
	if g.Epilogue == kernels.EpilogueNone {
		a, b := args.a, args.b
		for i := 0; i < g.BatchCount; i++ {
			args.a, args.b = a[min(i*g.StrideA, len(a)):], b[min(i*g.StrideB, len(b)):]
			cc := c
			if c.bf {
				cc.b16 = c.b16[min(i*g.StrideC, len(c.b16)):]
			} else {
				cc.f32 = c.f32[min(i*g.StrideC, len(c.f32)):]
			}
			args.in, args.out = cc, cc
			e.gemm(args, t)
		}
		return
	}
	if m == 0 || n == 0 {
		if g.Epilogue == kernels.EpilogueDGeluBGrad {
			zeroVec(matOf(o.Bias, 0), n)
		}
		if g.Epilogue == kernels.EpilogueBGrad {
			p.rowSums16(matOf(o.Bias, 0), &args)
		}
		return
	}
	switch g.Epilogue {
	case kernels.EpilogueBias:
		args.bias = matOf(o.Bias, 0)
		e.gemm(args, t)
	case kernels.EpilogueBiasGelu:
		// pre = R + bias; Aux = pre, C = gelu(pre).
		args.bias = matOf(o.Bias, 0)
		if !c.bf {
			aux := o.Aux.Float32()
			args.out = mat16{f32: aux, ld: n}
			e.gemm(args, t)
			rowBlocks(c.f32, g.LDC, aux, m, n, func(c, aux []float32) { p.e32.gelu(c, nil, aux, false, t) })
			return
		}
		sc := scratchPool.get()
		sc.s = growPanel(sc.s, m*n)
		args.out = mat16{f32: sc.s, ld: n}
		e.gemm(args, t)
		p.ew16(ewGeluEpi, m*n, ewArgs{f: sc.s, y: c.b16, ldy: g.LDC, cols: n, x: o.Aux.BFloat16()})
		scratchPool.put(sc)
	case kernels.EpilogueDGelu, kernels.EpilogueDGeluBGrad:
		// C = R ⊙ gelu'(Aux); Bias = Σ_rows C (of the float32 values).
		bias := matOf(o.Bias, 0)
		if !c.bf {
			e.gemm(args, t)
			aux := o.Aux.Float32()
			rowBlocks(c.f32, g.LDC, aux, m, n, func(c, aux []float32) { p.e32.gelu(c, c, aux, true, t) })
			if g.Epilogue == kernels.EpilogueDGeluBGrad {
				columnSum(bias.f32, c.f32, m, n, g.LDC, false)
			}
			return
		}
		sc := scratchPool.get()
		sc.s = growPanel(sc.s, m*n+n)
		args.out = mat16{f32: sc.s, ld: n}
		e.gemm(args, t)
		p.ew16(ewDGeluEpi, m*n, ewArgs{f: sc.s, y: c.b16, ldy: g.LDC, cols: n, x: o.Aux.BFloat16()})
		if g.Epilogue == kernels.EpilogueDGeluBGrad {
			sum := sc.s[m*n:][:n]
			columnSum(sum, sc.s, m, n, n, false)
			storeVec(bias, sum)
		}
		scratchPool.put(sc)
	case kernels.EpilogueBGrad:
		e.gemm(args, t)
		p.rowSums16(matOf(o.Bias, 0), &args)
	default:
		panic(fmt.Sprintf("cpu: unchecked epilogue %v", g.Epilogue))
	}
}

// rowSums16 sets bias[i] = Σ_k op(A)[i, k], summed in float32 in k order.
func (p *Provider) rowSums16(bias mat16, g *gemmArgs16) {
	sc := scratchPool.get()
	sc.s = grow(sc.s, g.m)
	s := sc.s
	clear(s)
	switch {
	case g.k == 0:
	case g.transA: // A is K rows of M
		p.e16.p.colSum(s, g.a, g.lda, g.k)
	default:
		for i := range s {
			var acc float32
			for _, v := range g.a[i*g.lda:][:g.k] {
				acc += v.Float32()
			}
			s[i] = acc
		}
	}
	storeVec(bias, s)
	scratchPool.put(sc)
}

// storeVec writes float32 values to a float32 or bfloat16 vector.
func storeVec(v mat16, s []float32) {
	if v.bf {
		for i, x := range s {
			v.b16[i] = tensor.ToBF16(x)
		}
		return
	}
	copy(v.f32, s)
}

func zeroVec(v mat16, n int) {
	if v.bf {
		clear(v.b16[:n])
	} else {
		clear(v.f32[:n])
	}
}

// biasGrad16 computes db (+)= Σ_rows dy with float32 sums, rows in order.
func (p *Provider) biasGrad16(db mat16, dy []bf16, m, n int, accumulate bool) {
	acc := db.f32
	var sc *scratch32
	if db.bf {
		sc = scratchPool.get()
		sc.s = grow(sc.s, n)
		acc = sc.s
		if accumulate {
			for j, v := range db.b16[:n] {
				acc[j] = v.Float32()
			}
		}
	}
	acc = acc[:n]
	if !accumulate {
		clear(acc)
	}
	p.e16.p.colSum(acc, dy, n, m)
	if sc != nil {
		storeVec(db, acc)
		scratchPool.put(sc)
	}
}

func (p *Provider) gelu16(y, dy, x []bf16, backward bool) {
	op := ewGeluF
	if backward {
		op = ewGeluB
	}
	p.ew16(op, len(x), ewArgs{y: y, dy: dy, x: x})
}

func (p *Provider) axpy16(alpha float32, x, y []bf16) {
	p.ew16(ewAxpy, len(y), ewArgs{x: x, y: y, alpha: alpha})
}

func (p *Provider) mse16(dy, y, t []bf16, scale float32) float64 {
	return p.ew16(ewMSE, len(y), ewArgs{dy: dy, x: y, t: t, alpha: scale})
}

// The elementwise bfloat16 ops run over a fixed grid of ewBlock elements (parts
// take whole blocks), each block in chunks of ewChunk widened to float32, so an
// element's result, and the MSE's sum (per block, blocks added in order), does
// not depend on the thread count.
const (
	ewBlock = 1 << 14
	ewChunk = 1 << 10
)

type ewOp uint8

const (
	ewGeluF    ewOp = iota // y = gelu(x)
	ewGeluB                // y = dy·gelu'(x)
	ewAxpy                 // y += alpha·x
	ewMSE                  // dy = alpha·(x − t); Σ (x − t)²
	ewCastTo16             // y = f
	ewCastTo32             // f = x
	// The epilogues on the float32 scratch f (rows of cols, y of leading dim ldy):
	ewGeluEpi  // x (aux) = f; y = gelu(f)
	ewDGeluEpi // f = f·gelu'(x); y = f
)

type ewArgs struct {
	x, y, dy, t []bf16
	f           []float32
	alpha       float32
	ldy, cols   int
}

type ewJob struct {
	ewArgs
	op    ewOp
	p     *path16
	n     int
	parts int
	sums  []float64
	wg    sync.WaitGroup
}

var ewJobs freeList[ewJob]

// ewBuf is one part's float32 chunks.
type ewBuf struct{ a, b, c [ewChunk]float32 }

var ewBufs freeList[ewBuf]

// ew16 runs op over n elements and returns the MSE's sum (0 for other ops).
func (p *Provider) ew16(op ewOp, n int, a ewArgs) float64 {
	if n == 0 {
		return 0
	}
	j := ewJobs.get()
	j.ewArgs, j.op, j.p, j.n = a, op, p.e16.p, n
	blocks := (n + ewBlock - 1) / ewBlock
	j.parts = max(1, min(p.nthreads(), blocks, n/(4*ewBlock)))
	if op == ewMSE {
		j.sums = growF64(j.sums, blocks)
	}
	parallel(j, j.parts, &j.wg)
	var sum float64
	if op == ewMSE {
		for _, s := range j.sums[:blocks] {
			sum += s
		}
	}
	j.ewArgs, j.p = ewArgs{}, nil
	ewJobs.put(j)
	return sum
}

func growF64(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}

func (j *ewJob) run(part int) {
	blocks := (j.n + ewBlock - 1) / ewBlock
	b0, b1 := span(blocks, j.parts, part)
	buf := ewBufs.get()
	for b := b0; b < b1; b++ {
		lo, hi := b*ewBlock, min((b+1)*ewBlock, j.n)
		var acc [4]float64
		for c := lo; c < hi; c += ewChunk {
			j.chunk(buf, c, min(c+ewChunk, hi), &acc)
		}
		if j.op == ewMSE {
			j.sums[b] = (acc[0] + acc[1]) + (acc[2] + acc[3])
		}
	}
	ewBufs.put(buf)
}

func (j *ewJob) chunk(buf *ewBuf, lo, hi int, acc *[4]float64) {
	n := hi - lo
	p := j.p
	fa, fb, fc := buf.a[:n], buf.b[:n], buf.c[:n]
	switch j.op {
	case ewGeluF:
		p.toF32(fa, j.x[lo:hi])
		p.gelu(fb, nil, fa, false)
		p.toBF16(j.y[lo:hi], fb)
	case ewGeluB:
		p.toF32(fa, j.x[lo:hi])
		p.toF32(fb, j.dy[lo:hi])
		p.gelu(fc, fb, fa, true)
		p.toBF16(j.y[lo:hi], fc)
	case ewAxpy:
		p.toF32(fa, j.x[lo:hi])
		p.toF32(fb, j.y[lo:hi])
		alpha := j.alpha
		for i, v := range fa {
			fb[i] += alpha * v
		}
		p.toBF16(j.y[lo:hi], fb)
	case ewMSE:
		p.toF32(fa, j.x[lo:hi])
		p.toF32(fb, j.t[lo:hi])
		s := j.alpha
		i := 0
		for ; i+4 <= n; i += 4 {
			for q := range 4 {
				d := fa[i+q] - fb[i+q]
				acc[q] += float64(d * d)
				fc[i+q] = s * d
			}
		}
		for ; i < n; i++ {
			d := fa[i] - fb[i]
			acc[0] += float64(d * d)
			fc[i] = s * d
		}
		p.toBF16(j.dy[lo:hi], fc)
	case ewCastTo16:
		p.toBF16(j.y[lo:hi], j.f[lo:hi])
	case ewCastTo32:
		p.toF32(j.f[lo:hi], j.x[lo:hi])
	case ewGeluEpi, ewDGeluEpi:
		// Element e of the scratch is row e/cols, column e%cols; go row piece by row piece.
		for e := lo; e < hi; {
			r, col := e/j.cols, e%j.cols
			w := min(hi-e, j.cols-col)
			f := j.f[e : e+w]
			aux := j.x[e : e+w]
			y := j.y[r*j.ldy+col:][:w]
			if j.op == ewGeluEpi {
				p.toBF16(aux, f)
				p.gelu(fb[:w], nil, f, false)
				p.toBF16(y, fb[:w])
			} else {
				p.toF32(fa[:w], aux)
				p.gelu(f, f, fa[:w], true)
				p.toBF16(y, f)
			}
			e += w
		}
	}
}
