package cpu

import (
	"sync"
)

// gemmArgs is one row-major GEMM: c = alpha·op(a)·op(b) + beta·c.
type gemmArgs[T float] struct {
	transA, transB bool
	m, n, k        int
	alpha, beta    T
	a, b, c        []T
	lda, ldb, ldc  int
	// bias, if set, replaces beta·c in the first K block by the row vector bias
	// (the fused linear bias); only with a micro-kernel that has biasFn.
	bias []T
}

// packBuf holds one goroutine's packed panels.
type packBuf[T float] struct {
	a, b, tile []T
}

// gemmJob is a GEMM split into parts over whole micro-tiles. Jobs and their pack
// buffers are pooled, so a call allocates nothing in the steady state.
type gemmJob[T float] struct {
	gemmArgs[T]
	uk     *ukernel[T]
	parts  int
	splitN bool
	// directB: the micro-kernel reads full B micro-panels straight from b (ldb
	// apart) instead of packed copies; used when few rows of A share each panel,
	// where packing would cost as much as the multiply.
	directB bool
	bufs    *freeList[packBuf[T]]
	wg      sync.WaitGroup
}

// directBTiles is the most micro-tile rows for which B is read unpacked.
var directBTiles = 2

// workPerThr is the least work (flops) worth handing to another goroutine.
var workPerThr = 1 << 21

// engine is everything the provider runs for one element type.
type engine[T float] struct {
	uk *ukernel[T]
	// ukTransA, if set, serves GEMMs with a transposed A (the weight gradient),
	// where it measured faster; the choice depends only on the problem.
	ukTransA *ukernel[T]
	dot      dotFunc[T]
	axpy     axpyFunc[T]
	jobs     *sync.Pool
	bufs     *freeList[packBuf[T]]
	gemvs    *sync.Pool
	scratch  *freeList[gemvScratch[T]]
	// gelu is y = gelu(x), or with backward y = dy·gelu'(x), on up to threads cores.
	gelu func(y, dy, x []T, backward bool, threads int)
}

// gemm computes one GEMM on up to threads goroutines. The partition is over
// micro-tiles of a grid anchored at (0, 0) and K is never split, so every element
// of c is computed by the same instructions in the same order whatever the
// thread count. M = 1 takes the GEMV path.
func (e *engine[T]) gemm(g gemmArgs[T], threads int) {
	if g.m == 0 || g.n == 0 {
		return
	}
	if g.k == 0 || g.alpha == 0 {
		scale(g.c, g.ldc, g.m, g.n, g.beta)
		return
	}
	if g.m == 1 && (!g.transA || g.lda == 1) {
		// c[0,:] = alpha·a[0,:]·op(B) + beta·c[0,:]
		if g.transB {
			e.gemv(false, g.n, g.k, g.b, g.ldb, g.a, g.c, g.alpha, g.beta, threads)
		} else {
			e.gemv(true, g.k, g.n, g.b, g.ldb, g.a, g.c, g.alpha, g.beta, threads)
		}
		return
	}
	uk := e.uk
	if g.transA && e.ukTransA != nil {
		uk = e.ukTransA
	}
	j := e.jobs.Get().(*gemmJob[T])
	j.gemmArgs, j.uk, j.bufs = g, uk, e.bufs
	tilesM := (g.m + uk.mr - 1) / uk.mr
	tilesN := (g.n + uk.nr - 1) / uk.nr
	j.directB = !g.transB && tilesM <= directBTiles && uk.masked
	flops := 2 * g.m * g.n * g.k
	threads = max(1, min(threads, flops/workPerThr))
	j.splitN = g.n >= g.m && tilesN >= threads || tilesM < threads
	if j.splitN {
		j.parts = min(threads, tilesN)
	} else {
		j.parts = min(threads, tilesM)
	}
	parallel(j, j.parts, &j.wg)
	j.gemmArgs = gemmArgs[T]{}
	e.jobs.Put(j)
}

func (e *engine[T]) gemv(trans bool, rows, cols int, a []T, lda int, x, out []T, alpha, beta T, threads int) {
	gemv(trans, rows, cols, a, lda, x, out, alpha, beta, threads, e.dot, e.axpy, e.gemvs, e.scratch)
}

func (j *gemmJob[T]) run(part int) {
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
	buf := j.bufs.get()
	j.block(buf, i0, i1, j0, j1)
	j.bufs.put(buf)
}

func grow[T float](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// growPanel is grow for packed-panel buffers (see allocPanel). A replaced buffer
// is dropped; buffers only grow, so this happens a few times per process.
func growPanel[T float](s []T, n int) []T {
	if cap(s) < n {
		return allocPanel[T](n + n/4)[:n]
	}
	return s[:n]
}

// block computes c[i0:i1, j0:j1] with the BLIS loop nest: jc over nc columns,
// pc over kc of K (B panel packed once, shared by all row blocks), ic over mc rows
// (A panel packed), then micro-panels jr and micro-tiles ir.
func (j *gemmJob[T]) block(buf *packBuf[T], i0, i1, j0, j1 int) {
	uk := j.uk
	mr, nr := uk.mr, uk.nr
	// Split each dimension into equal blocks no larger than the cache blocking, so
	// that no thin leftover block repeats the packing of a whole panel. Block
	// edges stay on the micro-tile grid, and K blocks depend only on K.
	ncb := balance(j1-j0, uk.nc, nr)
	kcb := balance(j.k, uk.kc, 1)
	mcb := balance(i1-i0, uk.mc, mr)
	if i1-i0 <= 2*uk.mc && !j.directB {
		// Up to two blocks' worth of rows (a grouped GEMM's expert) are one
		// block: B is then packed into one micro-panel slot, rewritten for
		// every micro-panel and kept in L2, instead of a whole kc×nc panel
		// written out to L3 for a second row block to read back.
		mcb = (i1 - i0 + mr - 1) / mr * mr
	}
	// With one row block, each B micro-panel is used once, right after its
	// packing.
	oneSlot := mcb >= i1-i0
	buf.b = growPanel(buf.b, kcb*ncb)
	buf.a = growPanel(buf.a, kcb*mcb)
	buf.tile = grow(buf.tile, mr*nr)
	for jc := j0; jc < j1; jc += ncb {
		nc := min(ncb, j1-jc)
		for pc := 0; pc < j.k; pc += kcb {
			kc := min(kcb, j.k-pc)
			beta := j.beta
			if pc > 0 {
				beta = 1
			}
			fullNC := nc
			if j.directB {
				// Only a partial last panel is packed (the kernel reads whole panels).
				fullNC = nc / nr * nr
				if fullNC < nc {
					packB(buf.b, j.b, j.ldb, j.transB, pc, kc, jc+fullNC, nc-fullNC, nr)
				}
			}
			// Without directB, each B micro-panel is packed just before its first
			// use (ic == i0), while its source is in flight and the packed copy is
			// still in L1/L2 for the kernel; later row blocks reuse it from L3
			// (with one row block there are none, and one slot serves).
			for ic := i0; ic < i1; ic += mcb {
				mc := min(mcb, i1-ic)
				packA(buf.a, j.a, j.lda, j.transA, ic, mc, pc, kc, mr)
				for jr := 0; jr < nc; jr += nr {
					cols := min(nr, nc-jr)
					slot := (jr / nr) * kc * nr
					if oneSlot {
						slot = 0
					}
					if ic == i0 && !j.directB {
						packB(buf.b[slot:], j.b, j.ldb, j.transB, pc, kc, jc+jr, cols, nr)
					}
					bp, ldb := &buf.b[slot], nr
					if j.directB && jr < fullNC {
						bp, ldb = &j.b[pc*j.ldb+jc+jr], j.ldb
					} else if j.directB {
						bp = &buf.b[0]
					}
					for ir := 0; ir < mc; ir += mr {
						rows := min(mr, mc-ir)
						ap := &buf.a[(ir/mr)*kc*mr]
						ci := (ic+ir)*j.ldc + jc + jr
						if pc == 0 && j.bias != nil {
							uk.biasFn(kc, ap, bp, ldb, &j.c[ci], j.ldc, rows, 1<<cols-1, j.alpha, &j.bias[jc+jr])
							continue
						}
						if uk.masked || (rows == mr && cols == nr) {
							uk.fn(kc, ap, bp, ldb, &j.c[ci], j.ldc, rows, 1<<cols-1, j.alpha, beta)
							continue
						}
						t := buf.tile
						uk.fn(kc, ap, bp, nr, &t[0], nr, mr, 1<<nr-1, 1, 0)
						for r := 0; r < rows; r++ {
							crow := j.c[ci+r*j.ldc:][:cols]
							trow := t[r*nr:][:cols]
							if beta == 0 {
								for x := range crow {
									crow[x] = j.alpha * trow[x]
								}
							} else {
								for x := range crow {
									crow[x] = j.alpha*trow[x] + beta*crow[x]
								}
							}
						}
					}
				}
			}
		}
	}
}

// scale sets c = beta·c (c = 0 without reading it when beta == 0).
func scale[T float](c []T, ldc, m, n int, beta T) {
	for i := 0; i < m; i++ {
		row := c[i*ldc:][:n]
		if beta == 0 {
			clear(row)
		} else if beta != 1 {
			for x := range row {
				row[x] *= beta
			}
		}
	}
}

// balance returns the block size that splits n into the fewest blocks of at
// most max, as equal as possible, rounded up to a multiple of unit.
func balance(n, max, unit int) int {
	if n <= 0 {
		return unit
	}
	blocks := (n + max - 1) / max
	b := (n + blocks - 1) / blocks
	return (b + unit - 1) / unit * unit
}
