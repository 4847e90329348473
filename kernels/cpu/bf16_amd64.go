//go:build amd64 && !noasm

package cpu

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// The VDPBF16PS micro-kernels (kernel_amd64.s, see internal/asmgen): an
// mr×nr tile from panels of bfloat16 pairs, through the output stage of e.
//
//go:noescape
func bgemmDP8x48(depth int, a, b *float32, mr int, mask uint64, e *epi16)

//go:noescape
func bgemmDPD8x32(depth int, a *float32, b *bf16, mr int, mask uint64, e *epi16, ldb int, odd int)

// transpose16x16b is transpose16x16pf without the prefetch, with leading dims
// in bytes.
//
//go:noescape
func transpose16x16b(dst *float32, ldd int, src *float32, lds int)

// The dot kernels: out[i*ldo+j] = Σ_k x_i[k]·w[j*ldw+k], x packed by steps.
// DP: VDPBF16PS on bfloat16 steps of 32; W: w widened, FMAs on float32 steps of 16.
//
//go:noescape
func bdotDP4x6(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)

//go:noescape
func bdotW4x6(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)

//go:noescape
func bdotDP4x1(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)

//go:noescape
func bdotDP2x6(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)

//go:noescape
func bdotDP2x1(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)

//go:noescape
func bdotDP1x6(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)

//go:noescape
func bdotDP1x1(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)

//go:noescape
func bdotW4x1(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)

//go:noescape
func bdotW2x6(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)

//go:noescape
func bdotW2x1(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)

//go:noescape
func bdotW1x6(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)

//go:noescape
func bdotW1x1(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)

// The helpers of bf16_amd64.s.
//
//go:noescape
func epiRowsAVX512(rows, cols int, src *float32, lds int, e *epi16)

//go:noescape
func cvtToF32AVX512(dst *float32, src *bf16, n int)

//go:noescape
func cvtToBF16AVX512(dst *bf16, src *float32, n int)

//go:noescape
func baxpy4W(n int, x *[4]float32, b *bf16, ldb int, acc *float32)

//go:noescape
func colSumBF16(acc *float32, a *bf16, lda, rows, n int)

//go:noescape
func baxpy1W(n int, x float32, b *bf16, acc *float32)

func init() {
	if !cpu.X86.HasAVX512F || !cpu.X86.HasAVX512BW || !cpu.X86.HasAVX512VL || !cpu.X86.HasAVX512DQ {
		return
	}
	widen := &path16{
		name: "avx512",
		uk: &ukernel16{name: "avx512", mr: 8, nr: 48, mc: 96, kc: 1024, nc: 4128,
			fn: widenTile, packA: packAWiden512, packB: packBWiden512},
		dots: [3][2]dotKernel16{
			{{4, 6, bdotW4x6}, {4, 1, bdotW4x1}},
			{{2, 6, bdotW2x6}, {2, 1, bdotW2x1}},
			{{1, 6, bdotW1x6}, {1, 1, bdotW1x1}},
		},
		dotE:    16,
		packX:   packDotXWiden,
		axpy:    axpyW16,
		epiRows: epiRows512,
		toF32:   toF32AVX512,
		toBF16:  toBF16AVX512,
		gelu:    gelu512,
		colSum:  colSum512,
	}
	paths := []*path16{widen}
	if cpu.X86.HasAVX512BF16 {
		dp := *widen
		dp.name = "avx512bf16"
		dp.uk = &ukernel16{name: "avx512bf16", mr: 8, nr: 48, pairs: true, mc: 96, kc: 2048, nc: 4128,
			fn: bgemmDP8x48, packA: packAPairs512, packB: packBPairs512}
		dp.dots = [3][2]dotKernel16{
			{{4, 6, bdotDP4x6}, {4, 1, bdotDP4x1}},
			{{2, 6, bdotDP2x6}, {2, 1, bdotDP2x1}},
			{{1, 6, bdotDP1x6}, {1, 1, bdotDP1x1}},
		}
		dp.dotE, dp.packX = 32, packDotX16
		dp.direct = bgemmDPD8x32
		paths = append([]*path16{&dp}, paths...)
	}
	bf16Paths = append(paths, bf16Paths...)
}

// widenTile runs the float32 AVX-512 micro-kernel on widened panels into the
// scratch tile, then the output stage.
func widenTile(depth int, a, b *float32, mr int, mask uint64, e *epi16) {
	sgemmAVX512(depth, a, b, 48, e.tile, 48, 8, 1<<48-1, 1, 0)
	cols := 0
	for m := mask; m != 0; m >>= 1 {
		cols++
	}
	epiRowsAVX512(mr, cols, e.tile, 48, e)
}

func epiRows512(rows, cols int, src []float32, lds int, e *epi16) {
	if rows == 0 || cols == 0 {
		return
	}
	_ = src[(rows-1)*lds+cols-1]
	epiRowsAVX512(rows, cols, &src[0], lds, e)
}

func toF32AVX512(dst []float32, src []bf16) {
	if len(src) == 0 {
		return
	}
	_ = dst[len(src)-1]
	cvtToF32AVX512(&dst[0], &src[0], len(src))
}

func toBF16AVX512(dst []bf16, src []float32) {
	if len(src) == 0 {
		return
	}
	_ = dst[len(src)-1]
	cvtToBF16AVX512(&dst[0], &src[0], len(src))
}

// colSum512 adds the rows of a (rows×len(acc), leading dim lda) to acc, rows
// in order (as colSumGo).
func colSum512(acc []float32, a []bf16, lda, rows int) {
	n := len(acc)
	if n == 0 || rows == 0 {
		return
	}
	_ = a[(rows-1)*lda+n-1]
	colSumBF16(&acc[0], &a[0], lda, rows, n)
}

// gelu512 is the float32 GELU: AVX-512 on whole 16-element blocks, gelu32 on
// the tail.
func gelu512(y, dy, x []float32, backward bool) {
	n := len(x)
	body := n &^ 15
	if body > 0 {
		if backward {
			geluBackwardAVX512(&y[0], &dy[0], &x[0], body)
		} else {
			geluForwardAVX512(&y[0], &x[0], body)
		}
	}
	for i := body; i < n; i++ {
		if backward {
			y[i] = dy[i] * geluGrad32(x[i])
		} else {
			y[i] = gelu32(x[i])
		}
	}
}

// axpyW16 adds Σ_r x[r]·b[r*ldb+j] to acc[j], rows in order, widened.
func axpyW16(acc []float32, x, b []bf16, ldb int) {
	n, rows := len(acc), len(x)
	if n == 0 || rows == 0 {
		return
	}
	_ = b[(rows-1)*ldb+n-1]
	r := 0
	for ; r+4 <= rows; r += 4 {
		xs := [4]float32{x[r].Float32(), x[r+1].Float32(), x[r+2].Float32(), x[r+3].Float32()}
		baxpy4W(n, &xs, &b[r*ldb], ldb, &acc[0])
	}
	for ; r < rows; r++ {
		baxpy1W(n, x[r].Float32(), &b[r*ldb], &acc[0])
	}
}

//go:noescape
func transpose16x16s(dst *float32, ldd int, src *float32, lds int, dst2 *float32)

//go:noescape
func pairRowsSplit(dst *float32, pstride int, src *bf16, lds int, pairs, chunks int)

//go:noescape
func unpairRows(dst *float32, src *float32, n, pairs, chunks int, smask uint64)

//go:noescape
func pairRows(dst *float32, ldd int, src *bf16, lds int, pairs, chunks int, lmask, smask uint64)

// maskBits returns a mask of the n low bits (n <= 64).
func maskBits(n int) uint64 {
	if n >= 64 {
		return ^uint64(0)
	}
	return 1<<n - 1
}

// packAPairs512 is packAPairs for 8-row panels: a transposed A (the weight
// gradient's dyᵀ) interleaves pairs of rows of a; an untransposed A transposes
// 32-bit pairs, two panels (16 rows) at a time.
func packAPairs512(dst []float32, a []bf16, lda int, trans bool, i0, mc, k0, kc, mr int) {
	if mr != 8 {
		packAPairs(dst, a, lda, trans, i0, mc, k0, kc, mr)
		return
	}
	kp := (kc + 1) / 2
	whole := kc / 2
	panel := func(p int) []uint32 { return lanes(dst[(p/8)*kp*8:][:kp*8]) }
	if trans {
		// Whole pairs of full panels walk the rows of a once, 16 columns at a
		// time; the rest panel by panel.
		p := 0
		if whole > 0 {
			chunks := mc / 16
			if chunks > 0 {
				_ = a[(k0+2*whole-1)*lda+i0+16*chunks-1]
				pairRowsSplit(&dst[0], kp*8*4, &a[k0*lda+i0], lda, whole, chunks)
				for q := 0; q < 16*chunks; q += 8 {
					packAPanel(panel(q), a, lda, true, i0+q, 8, k0, kc, whole, 8)
				}
				p = 16 * chunks
			}
		}
		for ; p < mc; p += 8 {
			rows := min(8, mc-p)
			d := panel(p)
			if whole > 0 {
				_ = a[(k0+2*whole-1)*lda+i0+p+rows-1]
				pairRows((*float32)(unsafe.Pointer(&d[0])), 8, &a[k0*lda+i0+p], lda, whole, 1, maskBits(rows), 0xff)
			}
			packAPanel(d, a, lda, true, i0+p, rows, k0, kc, whole, 8)
		}
		return
	}
	blocks := kc / 32 // 16 pairs each
	p := 0
	for ; p+16 <= mc; p += 16 {
		d0, d1 := panel(p), panel(p+8)
		src := a[(i0+p)*lda+k0:]
		if blocks > 0 {
			_ = src[15*lda+32*blocks-1]
		}
		for q := 0; q < blocks; q++ {
			transpose16x16s((*float32)(unsafe.Pointer(&d0[q*128])), 32, (*float32)(unsafe.Pointer(&src[32*q])), 2*lda,
				(*float32)(unsafe.Pointer(&d1[q*128])))
		}
		packAPanel(d0, a, lda, false, i0+p, 8, k0, kc, 16*blocks, 8)
		packAPanel(d1, a, lda, false, i0+p+8, 8, k0, kc, 16*blocks, 8)
	}
	for ; p < mc; p += 8 {
		packAPanel(panel(p), a, lda, false, i0+p, min(8, mc-p), k0, kc, 0, 8)
	}
}

// packBPairs512 is packBPairs with SIMD: a transposed B (stored N×K, the
// forward's weight) by 16×16 transposes of 32-bit pairs, an untransposed one
// by interleaving pairs of rows.
func packBPairs512(dst []float32, b []bf16, ldb int, trans bool, k0, kc, j0, nc, nr int) {
	kp := (kc + 1) / 2
	whole := kc / 2
	blocks := kc / 32
	chunks := (nr + 15) / 16
	if nr > 64 {
		packBPairs(dst, b, ldb, trans, k0, kc, j0, nc, nr)
		return
	}
	for q := 0; q < nc; q += nr {
		cols := min(nr, nc-q)
		d := lanes(dst[(q/nr)*kp*nr:][:kp*nr])
		if !trans {
			if whole > 0 {
				_ = b[(k0+2*whole-1)*ldb+j0+q+cols-1]
				pairRows((*float32)(unsafe.Pointer(&d[0])), nr, &b[k0*ldb+j0+q], ldb, whole, chunks,
					maskBits(cols), maskBits(nr-16*(chunks-1)))
			}
			packBPanel(d, b, ldb, false, k0, kc, j0+q, 0, cols, whole, nr)
			for p := whole; p < kp; p++ {
				clear(d[p*nr+cols : p*nr+nr])
			}
			continue
		}
		c16 := cols &^ 15
		for j := 0; j < c16; j += 16 {
			src := b[(j0+q+j)*ldb+k0:]
			if blocks > 0 {
				_ = src[15*ldb+32*blocks-1]
			}
			for p := 0; p < blocks; p++ {
				transpose16x16b((*float32)(unsafe.Pointer(&d[16*p*nr+j])), nr*4, (*float32)(unsafe.Pointer(&src[32*p])), ldb*2)
			}
		}
		packBPanel(d, b, ldb, true, k0, kc, j0+q, 0, c16, 16*blocks, nr)
		packBPanel(d, b, ldb, true, k0, kc, j0+q, c16, cols, 0, nr)
		for p := 0; p < kp; p++ {
			clear(d[p*nr+cols : p*nr+nr])
		}
	}
}

// pairScratch holds a panel of pairs on its way to float32 (the widened path).
type pairScratch struct{ s []float32 }

var pairScratches freeList[pairScratch]

// widenPanel widens a panel of kc rows of n lanes from pairs (kp = ceil(kc/2)
// rows) into dst (kc rows of n floats).
func widenPanel(dst, pairs []float32, kc, n int) {
	whole := kc / 2
	chunks := (n + 15) / 16
	if whole > 0 {
		_ = dst[kc*n-1]
		unpairRows(&dst[0], &pairs[0], n, whole, chunks, maskBits(n-16*(chunks-1)))
	}
	if kc%2 == 1 {
		last, row := lanes(pairs[whole*n:][:n]), lanes(dst[(kc-1)*n:][:n])
		for j, v := range last {
			row[j] = v << 16
		}
	}
}

// packAWiden512 is packAWiden through the pair packing: A packed as pairs,
// then widened panel by panel.
func packAWiden512(dst []float32, a []bf16, lda int, trans bool, i0, mc, k0, kc, mr int) {
	if mr > 64 {
		packAWiden(dst, a, lda, trans, i0, mc, k0, kc, mr)
		return
	}
	kp := (kc + 1) / 2
	sc := pairScratches.get()
	sc.s = grow(sc.s, ((mc+mr-1)/mr)*kp*mr)
	packAPairs512(sc.s, a, lda, trans, i0, mc, k0, kc, mr)
	for p := 0; p < mc; p += mr {
		widenPanel(dst[(p/mr)*kc*mr:], sc.s[(p/mr)*kp*mr:], kc, mr)
	}
	pairScratches.put(sc)
}

// packBWiden512 is packBWiden through the pair packing.
func packBWiden512(dst []float32, b []bf16, ldb int, trans bool, k0, kc, j0, nc, nr int) {
	if nr > 64 {
		packBWiden(dst, b, ldb, trans, k0, kc, j0, nc, nr)
		return
	}
	kp := (kc + 1) / 2
	sc := pairScratches.get()
	sc.s = grow(sc.s, ((nc+nr-1)/nr)*kp*nr)
	packBPairs512(sc.s, b, ldb, trans, k0, kc, j0, nc, nr)
	for q := 0; q < nc; q += nr {
		widenPanel(dst[(q/nr)*kc*nr:], sc.s[(q/nr)*kp*nr:], kc, nr)
	}
	pairScratches.put(sc)
}
