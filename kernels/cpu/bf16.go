package cpu

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/meshrun/meshrun/tensor"
)

// bfloat16 GEMMs: A and B bfloat16, products exact in float32, sums in float32,
// C float32 or bfloat16 (rounded once, to nearest even as tensor.ToBF16, after
// alpha, beta and the bias). Three paths, chosen at start-up (see bf16Paths):
//
//   - "avx512bf16": VDPBF16PS micro-kernels on panels of bfloat16 pairs: each
//     32-bit lane of a packed panel holds (k, k+1) of one row of A or one column
//     of B (an odd K is padded with a zero), and one instruction multiplies a
//     broadcast A pair by 16 B pairs and adds both products to 16 float32 sums.
//   - "avx512": for AVX-512 CPUs without AVX512_BF16: bfloat16 is widened to
//     float32 while packing and the float32 AVX-512 micro-kernel runs on the
//     panels; its tile goes through the same output stage.
//   - "go": portable Go (the noasm tag, other architectures).
//
// The loop nest is the float32 one (gemm.go): BLIS blocking, pooled panels,
// work split over output tiles only, never over K, so results do not depend on
// the thread count. With a bfloat16 C and K split into several KC blocks, the
// sums of the first blocks are kept in a float32 buffer and C is written once,
// by the last block. Small M with a transposed B (the forward of a linear layer
// on a few rows, M = 1 included) takes dot-product kernels that read both
// operands unpacked; an untransposed B with small M or small K a direct
// VDPBF16PS kernel that interleaves its rows in registers; M = 1 with an
// untransposed B streams B rows (axpy form). The VDPBF16PS path rounds
// bfloat16 stores with VCVTNE2PS2BF16, which, like VDPBF16PS, flushes
// denormals to zero; elsewhere rounding is exactly tensor.ToBF16.

type bf16 = tensor.BF16

// epi16 is the output stage of a tile (or of rows) of float32 results r:
//
//	v = alpha·r[i][j] (+ bias[j] when bias != nil) (+ beta·in[i][j] when beta != 0)
//	out[i][j] = v, as float32 or rounded to bfloat16
//
// in, out and bias point at element (0, 0) of the tile; ldIn and ldOut are in
// bytes; flags say which of them hold bfloat16. The assembly reads this struct
// through go_asm.h.
type epi16 struct {
	alpha, beta float32
	out         unsafe.Pointer
	ldOut       int
	in          unsafe.Pointer
	ldIn        int
	bias        unsafe.Pointer
	flags       uint64
	// tile is scratch for kernels that compute a tile before the output stage.
	tile *float32
}

const (
	epiOutBF16  = 1 << iota // out holds bfloat16
	epiInBF16               // in holds bfloat16
	epiBiasBF16             // bias holds bfloat16
)

// mat16 is a float32 or bfloat16 row-major matrix (or vector) operand.
type mat16 struct {
	f32 []float32
	b16 []bf16
	ld  int
	bf  bool // b16, not f32
}

func (m *mat16) valid() bool { return m.f32 != nil || m.b16 != nil }

func (m *mat16) size() int {
	if m.bf {
		return 2
	}
	return 4
}

// at returns a pointer to element (i, j).
func (m *mat16) at(i, j int) unsafe.Pointer {
	if m.bf {
		return unsafe.Pointer(&m.b16[i*m.ld+j])
	}
	return unsafe.Pointer(&m.f32[i*m.ld+j])
}

// gemmArgs16 is one bfloat16 GEMM: out = alpha·op(a)·op(b) + bias + beta·in.
type gemmArgs16 struct {
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	a, b           []bf16
	lda, ldb       int
	in, out        mat16 // in is read only when beta != 0; it may be out itself
	bias           mat16 // a row vector (N) when valid
}

// ukernel16 is a packed-panel micro-kernel for bfloat16 GEMMs and its blocking.
// With pairs, panels hold bfloat16 pairs along k (depth = ceil(kc/2) 32-bit
// lanes per row or column); otherwise float32 values (depth kc).
type ukernel16 struct {
	name       string
	mr, nr     int
	pairs      bool
	mc, kc, nc int
	// fn computes the mr×nr tile from panels a (depth×mr) and b (depth×nr) and
	// applies e to rows < mr and the columns set in mask.
	fn    func(depth int, a, b *float32, mr int, mask uint64, e *epi16)
	packA func(dst []float32, a []bf16, lda int, trans bool, i0, mc, k0, kc, mr int)
	packB func(dst []float32, b []bf16, ldb int, trans bool, k0, kc, j0, nc, nr int)
}

func (uk *ukernel16) depth(kc int) int {
	if uk.pairs {
		return (kc + 1) / 2
	}
	return kc
}

// dotKernel16 computes out[i*ldo+j] = Σ_{k<n} x_i[k]·w[j*ldw+k] for i < r,
// j < c, in float32, the same way for every (i, j), from the r rows x_i packed
// by the path's packX.
type dotKernel16 struct {
	r, c int
	fn   func(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)
}

// directKernel16 computes an 8×32 tile reading an untransposed B in place:
// depth whole pairs of rows from b (ldb elements apart), plus one row paired
// with zeros when odd is 1, against an 8-row A panel of pairs; then applies e
// to rows < mr and the columns in mask (columns past it are not read).
type directKernel16 func(depth int, a *float32, b *bf16, mr int, mask uint64, e *epi16, ldb int, odd int)

// path16 is one way to run the bfloat16 kernels.
type path16 struct {
	name string
	uk   *ukernel16
	// direct, if set, serves small M with an untransposed B (8×32 tiles):
	// packing B would cost more than the multiply.
	direct directKernel16
	// dots are the small-M kernels, by rows r (4, 2, 1); each entry has the
	// kernel for its widest c and one with c = 1. packX packs r rows of x (n
	// elements, leading dim ldx) for them: per step of dotE elements, r rows
	// of 64 bytes (dotE bfloat16 or float32 values), zero past n.
	dots  [3][2]dotKernel16
	dotE  int
	packX func(dst []float32, x []bf16, ldx, r, n int)
	// axpy adds Σ_r x[r]·b[r*ldb+j] to acc[j] (j < len(acc)), rows in order.
	axpy    func(acc []float32, x, b []bf16, ldb int)
	epiRows func(rows, cols int, src []float32, lds int, e *epi16)
	toF32   func(dst []float32, src []bf16)
	toBF16  func(dst []bf16, src []float32)
	// gelu is y = gelu(x) or, with backward, y = dy·gelu'(x), in float32.
	gelu func(y, dy, x []float32, backward bool)
	// colSum adds the rows of a (leading dim lda) to acc, rows in order.
	colSum func(acc []float32, a []bf16, lda, rows int)
}

// bf16Paths lists the paths this machine runs, best first; "go" is last.
var bf16Paths = []*path16{goPath16}

var goPath16 = &path16{
	name: "go",
	uk: &ukernel16{name: "go", mr: 4, nr: 4, mc: 128, kc: 256, nc: 1024,
		fn: goTile16, packA: packAWiden, packB: packBWiden},
	dots: [3][2]dotKernel16{
		{{4, 1, dotGo16(4, 1)}, {4, 1, dotGo16(4, 1)}},
		{{2, 1, dotGo16(2, 1)}, {2, 1, dotGo16(2, 1)}},
		{{1, 1, dotGo16(1, 1)}, {1, 1, dotGo16(1, 1)}},
	},
	dotE:    32,
	packX:   packDotX16,
	axpy:    axpyGo16,
	epiRows: epiRowsGo,
	toF32:   toF32Go,
	toBF16:  toBF16Go,
	gelu:    geluGo32,
	colSum:  colSumGo,
}

// BF16Kernels returns the bfloat16 paths this machine can run, best first:
// "avx512bf16" (VDPBF16PS), "avx512" (widened to float32), "go".
func BF16Kernels() []string {
	var names []string
	for _, p := range bf16Paths {
		names = append(names, p.name)
	}
	return names
}

func findPath16(name string) (*path16, error) {
	for _, p := range bf16Paths {
		if p.name == name {
			return p, nil
		}
	}
	return nil, fmt.Errorf("cpu: bfloat16 kernel %q not available here (have %v)", name, BF16Kernels())
}

// packBuf16 holds one goroutine's panels and scratch.
type packBuf16 struct {
	a, b, part, tile, rows []float32
	e                      epi16
}

var bufPool16 freeList[packBuf16]

// engine16 runs bfloat16 GEMMs on one path.
type engine16 struct {
	p *path16
}

var jobPool16 = sync.Pool{New: func() any { return new(gemmJob16) }}

// gemmJob16 is a bfloat16 GEMM split into parts over whole micro-tiles of a
// grid anchored at (0, 0) (on the dot and axpy paths, over fixed column or row
// chunks): results do not depend on the number of parts.
type gemmJob16 struct {
	gemmArgs16
	p      *path16
	uk     *ukernel16
	kind   int // jobPacked, jobDot, jobAxpy, jobDirect
	parts  int
	splitN bool
	// axpy form: row chunks of B and their partial sums (chunks×n).
	chunks, chunkRows int
	partial           []float32
	// dot form: the row groups of A (first row, dots index) and their packed copies.
	groups  []dotGroup
	xpacked []float32
	wg      sync.WaitGroup
}

// dotGroup is a group of rows of A for one dot kernel, packed at off in xpacked.
type dotGroup struct{ i0, g, off int }

const (
	jobPacked = iota
	jobDot
	jobAxpy
	jobDirect
)

// dotMaxM is the largest M that takes the dot kernels (with a transposed B).
var dotMaxM = 16

// dotChunk is the column grid of the dot path: rows of B per epilogue pass.
const dotChunk = 32

// gemm computes one bfloat16 GEMM on up to threads goroutines.
func (e *engine16) gemm(g gemmArgs16, threads int) {
	if g.m == 0 || g.n == 0 {
		return
	}
	if g.k == 0 || g.alpha == 0 {
		epiNoProduct(&g)
		return
	}
	j := jobPool16.Get().(*gemmJob16)
	j.gemmArgs16, j.p, j.uk = g, e.p, e.p.uk
	flops := 2 * g.m * g.n * g.k
	threads = max(1, min(threads, flops/workPerThr))
	switch {
	case g.m == 1 && (!g.transA || g.lda == 1) && !g.transB:
		// out[0,:] = Σ_k a[k]·b[k,:]: stream rows of B.
		j.kind = jobAxpy
		j.chunks, j.chunkRows = axpyChunks(g.k)
		buf := bufPool16.get()
		buf.rows = grow(buf.rows, j.chunks*g.n+g.n)
		j.partial = buf.rows
		j.parts = min(threads, j.chunks)
		parallel(j, j.parts, &j.wg)
		sum := j.partial[j.chunks*g.n:][:g.n]
		copy(sum, j.partial[:g.n])
		for c := 1; c < j.chunks; c++ {
			for x, v := range j.partial[c*g.n:][:g.n] {
				sum[x] += v
			}
		}
		buf.e.whole(&g, 0, 0)
		e.p.epiRows(1, g.n, sum, g.n, &buf.e)
		bufPool16.put(buf)
	case g.transB && g.m <= dotMaxM && (!g.transA || g.m == 1 && g.lda == 1):
		if g.transA { // one row stored as a column of lda = 1
			g.transA, g.lda = false, g.k
			j.gemmArgs16 = g
		}
		j.kind = jobDot
		buf := bufPool16.get()
		j.packDotX(buf)
		j.parts = min(threads, (g.n+dotChunk-1)/dotChunk)
		parallel(j, j.parts, &j.wg)
		bufPool16.put(buf)
	case !g.transB && (g.m <= directMaxM || g.k <= directMaxK) && e.p.direct != nil:
		// A packed once (a few 8-row panels, or short ones), B read in place:
		// with few rows, columns split (each B column strip read once, all
		// rows at a time); with a short K (a weight gradient over a few rows
		// of a batch), rows split, each row panel written left to right.
		j.kind = jobDirect
		buf := bufPool16.get()
		kp := (g.k + 1) / 2
		buf.a = growPanel(buf.a, (g.m+7)/8*8*kp)
		j.xpacked = buf.a
		e.p.uk.packA(j.xpacked, g.a, g.lda, g.transA, 0, g.m, 0, g.k, 8) // the pairs path
		j.splitN = g.m <= directMaxM
		if j.splitN {
			j.parts = min(threads, (g.n+31)/32)
		} else {
			j.parts = min(threads, (g.m+7)/8)
		}
		parallel(j, j.parts, &j.wg)
		bufPool16.put(buf)
	default:
		uk := j.uk
		j.kind = jobPacked
		tilesM := (g.m + uk.mr - 1) / uk.mr
		tilesN := (g.n + uk.nr - 1) / uk.nr
		j.splitN = g.n >= g.m && tilesN >= threads || tilesM < threads
		if j.splitN {
			j.parts = min(threads, tilesN)
		} else {
			j.parts = min(threads, tilesM)
		}
		parallel(j, j.parts, &j.wg)
	}
	j.gemmArgs16, j.partial, j.xpacked = gemmArgs16{}, nil, nil
	jobPool16.Put(j)
}
