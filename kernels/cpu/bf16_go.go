package cpu

import (
	"unsafe"

	"github.com/meshrun/meshrun/tensor"
)

// The portable bfloat16 kernels: the "go" path, and the reference the
// assembly paths are tested against.

// goTile16 runs the portable 4×4 float32 micro-kernel on widened panels into the
// scratch tile, then the output stage.
func goTile16(depth int, a, b *float32, mr int, mask uint64, e *epi16) {
	t := unsafe.Slice(e.tile, 16)
	goKernel(depth, a, b, 4, &t[0], 4, 4, 0xf, 1, 0)
	cols := 0
	for mask != 0 {
		cols++
		mask >>= 1
	}
	epiRowsGo(mr, cols, t, 4, e)
}

// epiRowsGo applies e to rows×cols float32 results src (leading dim lds).
func epiRowsGo(rows, cols int, src []float32, lds int, e *epi16) {
	for i := 0; i < rows; i++ {
		r := src[i*lds:][:cols]
		for j, x := range r {
			v := e.alpha * x
			if e.bias != nil {
				v += loadF(e.bias, j, e.flags&epiBiasBF16 != 0)
			}
			if e.beta != 0 {
				v += e.beta * loadF(unsafe.Add(e.in, i*e.ldIn), j, e.flags&epiInBF16 != 0)
			}
			p := unsafe.Add(e.out, i*e.ldOut)
			if e.flags&epiOutBF16 != 0 {
				*(*bf16)(unsafe.Add(p, 2*j)) = tensor.ToBF16(v)
			} else {
				*(*float32)(unsafe.Add(p, 4*j)) = v
			}
		}
	}
}

// loadF reads element j of a float32 or bfloat16 row as float32.
func loadF(p unsafe.Pointer, j int, bf bool) float32 {
	if bf {
		return (*bf16)(unsafe.Add(p, 2*j)).Float32()
	}
	return *(*float32)(unsafe.Add(p, 4*j))
}

// packAWiden packs op(A)[i0:i0+mc, k0:k0+kc] as float32 panels of mr rows (see
// packA), widening bfloat16.
func packAWiden(dst []float32, a []bf16, lda int, trans bool, i0, mc, k0, kc, mr int) {
	for p := 0; p < mc; p += mr {
		rows := min(mr, mc-p)
		d := dst[(p/mr)*kc*mr:][:kc*mr]
		for i := 0; i < rows; i++ {
			if trans {
				for k := 0; k < kc; k++ {
					d[k*mr+i] = a[(k0+k)*lda+i0+p+i].Float32()
				}
				continue
			}
			for k, v := range a[(i0+p+i)*lda+k0:][:kc] {
				d[k*mr+i] = v.Float32()
			}
		}
		for i := rows; i < mr; i++ {
			for k := 0; k < kc; k++ {
				d[k*mr+i] = 0
			}
		}
	}
}

// packBWiden packs op(B)[k0:k0+kc, j0:j0+nc] as float32 panels of nr columns
// (see packB), widening bfloat16.
func packBWiden(dst []float32, b []bf16, ldb int, trans bool, k0, kc, j0, nc, nr int) {
	for q := 0; q < nc; q += nr {
		cols := min(nr, nc-q)
		d := dst[(q/nr)*kc*nr:][:kc*nr]
		for k := 0; k < kc; k++ {
			dk := d[k*nr : k*nr+nr]
			if trans {
				for j := 0; j < cols; j++ {
					dk[j] = b[(j0+q+j)*ldb+k0+k].Float32()
				}
			} else {
				for j, v := range b[(k0+k)*ldb+j0+q:][:cols] {
					dk[j] = v.Float32()
				}
			}
			clear(dk[cols:])
		}
	}
}

// pair packs two bfloat16 values into one 32-bit lane: lo at k, hi at k+1.
func pair(lo, hi bf16) uint32 { return uint32(lo) | uint32(hi)<<16 }

// lanes views packed panels as 32-bit lanes (bfloat16 pairs are not floats:
// they must be moved as bits).
func lanes(s []float32) []uint32 {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&s[0])), len(s))
}

// packAPairs packs op(A)[i0:i0+mc, k0:k0+kc] as panels of mr rows of bfloat16
// pairs: panel p holds, for each pair q, the mr lanes (op(A)[i][k0+2q],
// op(A)[i][k0+2q+1]), zero past row mc and past kc.
func packAPairs(dst []float32, a []bf16, lda int, trans bool, i0, mc, k0, kc, mr int) {
	kp := (kc + 1) / 2
	for p := 0; p < mc; p += mr {
		d := lanes(dst[(p/mr)*kp*mr:][:kp*mr])
		packAPanel(d, a, lda, trans, i0+p, min(mr, mc-p), k0, kc, 0, mr)
	}
}

// packAPanel fills pairs q >= q0 of one A panel (rows from row i0, rows of
// them real, the rest zero).
func packAPanel(d []uint32, a []bf16, lda int, trans bool, i0, rows, k0, kc, q0, mr int) {
	kp := (kc + 1) / 2
	whole := kc / 2
	for i := 0; i < rows; i++ {
		if trans { // op(A)[i][k] = a[k*lda+i]
			col := a[k0*lda+i0+i:]
			for q := q0; q < whole; q++ {
				d[q*mr+i] = pair(col[2*q*lda], col[(2*q+1)*lda])
			}
			if whole < kp && whole >= q0 {
				d[whole*mr+i] = pair(col[2*whole*lda], 0)
			}
			continue
		}
		row := a[(i0+i)*lda+k0:][:kc]
		for q := q0; q < whole; q++ {
			d[q*mr+i] = pair(row[2*q], row[2*q+1])
		}
		if whole < kp && whole >= q0 {
			d[whole*mr+i] = pair(row[kc-1], 0)
		}
	}
	for q := q0; q < kp; q++ {
		clear(d[q*mr+rows : q*mr+mr])
	}
}

// packBPairs packs op(B)[k0:k0+kc, j0:j0+nc] as panels of nr columns of
// bfloat16 pairs along k, zero past nc and past kc.
func packBPairs(dst []float32, b []bf16, ldb int, trans bool, k0, kc, j0, nc, nr int) {
	kp := (kc + 1) / 2
	for q := 0; q < nc; q += nr {
		cols := min(nr, nc-q)
		d := lanes(dst[(q/nr)*kp*nr:][:kp*nr])
		packBPanel(d, b, ldb, trans, k0, kc, j0+q, 0, cols, 0, nr)
		for p := 0; p < kp; p++ {
			clear(d[p*nr+cols : p*nr+nr])
		}
	}
}

// packBPanel fills columns [c0, c1) of pairs q >= q0 of one B panel whose first
// column is column j0 of op(B).
func packBPanel(d []uint32, b []bf16, ldb int, trans bool, k0, kc, j0, c0, c1, q0, nr int) {
	kp := (kc + 1) / 2
	whole := kc / 2
	for j := c0; j < c1; j++ {
		if trans { // op(B)[k][j] = b[j*ldb+k]
			row := b[(j0+j)*ldb+k0:][:kc]
			for q := q0; q < whole; q++ {
				d[q*nr+j] = pair(row[2*q], row[2*q+1])
			}
			if whole < kp && whole >= q0 {
				d[whole*nr+j] = pair(row[kc-1], 0)
			}
			continue
		}
		col := b[k0*ldb+j0+j:]
		for q := q0; q < whole; q++ {
			d[q*nr+j] = pair(col[2*q*ldb], col[(2*q+1)*ldb])
		}
		if whole < kp && whole >= q0 {
			d[whole*nr+j] = pair(col[2*whole*ldb], 0)
		}
	}
}

// packDotX16 packs r rows of x for the dot kernels that take bfloat16 steps of
// 32: dst (as bfloat16) holds, for each step s and row i, x[i*ldx+32s+t] for
// t < 32, zero past n.
func packDotX16(dst32 []float32, x []bf16, ldx, r, n int) {
	steps := (n + 31) / 32
	dst := unsafe.Slice((*bf16)(unsafe.Pointer(&dst32[0])), steps*r*32)
	for s := 0; s < steps; s++ {
		k0 := 32 * s
		w := min(32, n-k0)
		for i := 0; i < r; i++ {
			d := dst[(s*r+i)*32:][:32]
			copy(d, x[i*ldx+k0:][:w])
			clear(d[w:])
		}
	}
}

// packDotXWiden packs r rows of x widened to float32, in steps of 16.
func packDotXWiden(dst []float32, x []bf16, ldx, r, n int) {
	steps := (n + 15) / 16
	for s := 0; s < steps; s++ {
		k0 := 16 * s
		w := min(16, n-k0)
		for i := 0; i < r; i++ {
			d := dst[(s*r+i)*16:][:16]
			for t, v := range x[i*ldx+k0:][:w] {
				d[t] = v.Float32()
			}
			clear(d[w:])
		}
	}
}

// dotGo16 returns the portable r×c dot kernel on rows packed by packDotX16.
func dotGo16(r, c int) func(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int) {
	return func(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int) {
		steps := (n + 31) / 32
		xs := unsafe.Slice(xp, steps*r*32)
		ws := unsafe.Slice(w, (c-1)*ldw+n)
		os := unsafe.Slice(out, (r-1)*ldo+c)
		for i := 0; i < r; i++ {
			for j := 0; j < c; j++ {
				wr := ws[j*ldw:][:n]
				var s float32
				for k, v := range wr {
					s += xs[((k/32)*r+i)*32+k%32].Float32() * v.Float32()
				}
				os[i*ldo+j] = s
			}
		}
	}
}

// axpyGo16 adds Σ_r x[r]·b[r*ldb+j] to acc[j], rows in order.
func axpyGo16(acc []float32, x, b []bf16, ldb int) {
	n := len(acc)
	for r, v := range x {
		xv := v.Float32()
		for j, w := range b[r*ldb:][:n] {
			acc[j] += xv * w.Float32()
		}
	}
}

// colSumGo adds the rows of a (rows×len(acc), leading dim lda) to acc, rows
// in order.
func colSumGo(acc []float32, a []bf16, lda, rows int) {
	n := len(acc)
	for i := 0; i < rows; i++ {
		for j, v := range a[i*lda:][:n] {
			acc[j] += v.Float32()
		}
	}
}

func toF32Go(dst []float32, src []bf16) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = v.Float32()
	}
}

func toBF16Go(dst []bf16, src []float32) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = tensor.ToBF16(v)
	}
}

// geluGo32 is the portable float32 GELU (gelu32, geluGrad32) on a whole slice.
func geluGo32(y, dy, x []float32, backward bool) {
	y = y[:len(x)]
	if backward {
		dy = dy[:len(x)]
	}
	for i, v := range x {
		if backward {
			y[i] = dy[i] * geluGrad32(v)
		} else {
			y[i] = gelu32(v)
		}
	}
}
