package cpu

import "sync"

// GEMV kernels. The dot form computes out[r] = alpha·Σ_k x[k]·a[r*lda+k] + beta·out[r];
// the axpy form computes out[j] = alpha·Σ_r x[r]·a[r*lda+j] + beta·out[j]. Both are
// split over outputs only, in blocks of a fixed grid, and every output goes
// through the same instructions, so results do not depend on the thread count.

// gemvRows is the row group of the dot kernels. Rows past the last full group
// are computed one at a time by calling the same kernel with lda = 0.
const gemvRows = 4

type (
	dotFunc[T float]  func(n int, x, a []T, lda int, out *[gemvRows]T)
	axpyFunc[T float] func(acc, x, a []T, lda int)
)

type gemvJob[T float] struct {
	trans       bool // axpy form
	rows, cols  int  // a is rows×cols with leading dim lda
	a, x, out   []T
	lda         int
	alpha, beta T
	parts       int
	wg          sync.WaitGroup
	dot         dotFunc[T]
	axpy        axpyFunc[T]
	scratch     *freeList[gemvScratch[T]]
	// axpy form: row chunks and their partial sums (chunks×cols).
	chunks, chunkRows int
	partial           []T
}

// gemvScratch is one part's working memory (kept off the stack, where the
// kernels' func values would make it escape).
type gemvScratch[T float] struct {
	res [gemvRows]T
	acc []T // the axpy form's partial sums
}

var (
	gemvScratch32 freeList[gemvScratch[float32]]
	gemvScratch64 freeList[gemvScratch[float64]]
)

var (
	gemvPool32 = sync.Pool{New: func() any { return new(gemvJob[float32]) }}
	gemvPool64 = sync.Pool{New: func() any { return new(gemvJob[float64]) }}
)

func (j *gemvJob[T]) put(i int, v T) {
	o := &j.out[i]
	if j.beta == 0 {
		*o = j.alpha * v
	} else {
		*o = j.alpha*v + j.beta**o
	}
}

func (j *gemvJob[T]) run(part int) {
	sc := j.scratch.get()
	defer j.scratch.put(sc)
	if !j.trans {
		full := j.rows / gemvRows
		g0, g1 := span(full, j.parts, part)
		res := &sc.res
		for g := g0; g < g1; g++ {
			r0 := g * gemvRows
			j.dot(j.cols, j.x, j.a[r0*j.lda:], j.lda, res)
			for i, v := range res {
				j.put(r0+i, v)
			}
		}
		if part == j.parts-1 {
			for r := full * gemvRows; r < j.rows; r++ {
				j.dot(j.cols, j.x, j.a[r*j.lda:], 0, res)
				j.put(r, res[0])
			}
		}
		return
	}
	// Axpy form: part owns whole row chunks and fills their partial sums.
	c0, c1 := span(j.chunks, j.parts, part)
	for c := c0; c < c1; c++ {
		r0 := c * j.chunkRows
		r1 := min(j.rows, r0+j.chunkRows)
		acc := j.partial[c*j.cols : (c+1)*j.cols]
		clear(acc)
		j.axpy(acc, j.x[r0:r1], j.a[r0*j.lda:], j.lda)
	}
}

// axpyChunks splits the rows of the axpy form into a number of chunks that
// depends on the row count only: each chunk's partial sums are computed
// independently (in parallel) and then added in chunk order, so results do not
// depend on the thread count, and each thread streams whole rows.
func axpyChunks(rows int) (chunks, chunkRows int) {
	chunks = max(1, min(8, rows/256))
	chunkRows = (rows + chunks - 1) / chunks
	chunkRows = (chunkRows + gemvRows - 1) / gemvRows * gemvRows
	chunks = (rows + chunkRows - 1) / chunkRows
	return chunks, chunkRows
}

// gemv runs the dot form (trans = false: out has rows elements, x has cols) or the
// axpy form (trans = true: out has cols elements, x has rows).
func gemv[T float](trans bool, rows, cols int, a []T, lda int, x, out []T, alpha, beta T, threads int,
	dot dotFunc[T], axpy axpyFunc[T], pool *sync.Pool, scratch *freeList[gemvScratch[T]]) {
	nout := rows
	if trans {
		nout = cols
	}
	if nout == 0 {
		return
	}
	if rows == 0 || cols == 0 || alpha == 0 {
		scale(out, nout, 1, nout, beta)
		return
	}
	j := pool.Get().(*gemvJob[T])
	*j = gemvJob[T]{trans: trans, rows: rows, cols: cols, a: a, x: x, out: out, lda: lda,
		alpha: alpha, beta: beta, dot: dot, axpy: axpy, scratch: scratch}
	if !trans {
		j.parts = max(1, min(threads, rows/gemvRows, 2*rows*cols/workPerThr))
		parallel(j, j.parts, &j.wg)
	} else {
		j.chunks, j.chunkRows = axpyChunks(rows)
		sc := scratch.get()
		sc.acc = grow(sc.acc, j.chunks*cols)
		j.partial = sc.acc
		j.parts = max(1, min(threads, j.chunks, 2*rows*cols/workPerThr))
		parallel(j, j.parts, &j.wg)
		for c := 0; c < cols; c++ {
			v := j.partial[c]
			for k := 1; k < j.chunks; k++ {
				v += j.partial[k*cols+c]
			}
			j.put(c, v)
		}
		scratch.put(sc)
	}
	*j = gemvJob[T]{}
	pool.Put(j)
}

// dotGo is the portable dot kernel: out[i] = Σ_k x[k]·a[i*lda+k] for i < 4.
func dotGo[T float](n int, x, a []T, lda int, out *[gemvRows]T) {
	x = x[:n]
	r0, r1, r2, r3 := a[:n], a[lda:][:n], a[2*lda:][:n], a[3*lda:][:n]
	var s0, s1, s2, s3 T
	for k, v := range x {
		s0 += v * r0[k]
		s1 += v * r1[k]
		s2 += v * r2[k]
		s3 += v * r3[k]
	}
	*out = [gemvRows]T{s0, s1, s2, s3}
}

// axpyGo is the portable axpy kernel: acc[j] += x[r]·a[r*lda+j] for r in order.
func axpyGo[T float](acc, x, a []T, lda int) {
	n := len(acc)
	for r, v := range x {
		row := a[r*lda:][:n]
		for i := range acc {
			acc[i] += v * row[i]
		}
	}
}
