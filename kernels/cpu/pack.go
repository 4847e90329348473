package cpu

// packA copies op(A)[i0:i0+mc, k0:k0+kc] into dst as panels of mr rows: panel p
// holds, for each k, the mr values op(A)[i0+p*mr+i][k0+k], zero past row mc.
func packA[T float](dst, a []T, lda int, trans bool, i0, mc, k0, kc, mr int) {
	if trans {
		// A is stored K×M: op(A)[i][k] = a[k*lda+i]. Walk k in the outer loop so
		// each stored row segment is read once, start to end, for all panels.
		for k := 0; k < kc; k++ {
			src := a[(k0+k)*lda+i0:][:mc]
			p := 0
			if mr == 8 {
				for ; p+8 <= mc; p += 8 {
					*(*[8]T)(dst[(p/8)*kc*8+k*8:]) = *(*[8]T)(src[p:])
				}
			}
			for ; p < mc; p += mr {
				rows := min(mr, mc-p)
				dk := dst[(p/mr)*kc*mr+k*mr:][:mr]
				copy(dk, src[p:p+rows])
				clear(dk[rows:])
			}
		}
		return
	}
	for p := 0; p < mc; p += mr {
		rows := min(mr, mc-p)
		d := dst[(p/mr)*kc*mr:][:kc*mr]
		if rows == 8 && mr == 8 {
			packA8(d, a[(i0+p)*lda+k0:], lda, kc)
			continue
		}
		for i := 0; i < rows; i++ {
			src := a[(i0+p+i)*lda+k0:][:kc]
			for k, v := range src {
				d[k*mr+i] = v
			}
		}
		for i := rows; i < mr; i++ {
			for k := 0; k < kc; k++ {
				d[k*mr+i] = 0
			}
		}
	}
}

// packB copies op(B)[k0:k0+kc, j0:j0+nc] into dst as panels of nr columns:
// panel q holds, for each k, the nr values op(B)[k0+k][j0+q*nr+j], zero past nc.
func packB[T float](dst, b []T, ldb int, trans bool, k0, kc, j0, nc, nr int) {
	for q := 0; q < nc; q += nr {
		cols := min(nr, nc-q)
		d := dst[(q/nr)*kc*nr:][:kc*nr]
		if !trans {
			if nr == 48 && cols == 48 {
				for k := 0; k < kc; k++ {
					*(*[48]T)(d[k*48:]) = *(*[48]T)(b[(k0+k)*ldb+j0+q:])
				}
				continue
			}
			for k := 0; k < kc; k++ {
				dk := d[k*nr : k*nr+nr]
				copy(dk, b[(k0+k)*ldb+j0+q:][:cols])
				clear(dk[cols:])
			}
			continue
		}
		// B is stored N×K: op(B)[k][j] = b[j*ldb+k].
		if packBTrans32 != nil {
			if b32, ok := any(b).([]float32); ok && packBTrans32(any(d).([]float32), b32, ldb, k0, kc, j0+q, cols, nr) {
				continue
			}
		}
		j := 0
		for ; j+4 <= cols; j += 4 {
			s0 := b[(j0+q+j)*ldb+k0:][:kc]
			s1 := b[(j0+q+j+1)*ldb+k0:][:kc]
			s2 := b[(j0+q+j+2)*ldb+k0:][:kc]
			s3 := b[(j0+q+j+3)*ldb+k0:][:kc]
			for k := range s0 {
				dk := d[k*nr+j : k*nr+j+4 : k*nr+j+4]
				dk[0], dk[1], dk[2], dk[3] = s0[k], s1[k], s2[k], s3[k]
			}
		}
		for ; j < cols; j++ {
			src := b[(j0+q+j)*ldb+k0:][:kc]
			for k, v := range src {
				d[k*nr+j] = v
			}
		}
		if cols < nr {
			for k := 0; k < kc; k++ {
				clear(d[k*nr+cols : k*nr+nr])
			}
		}
	}
}

// packA8 packs 8 full rows of a (leading dim lda), kc columns, k-major.
func packA8[T float](d, a []T, lda, kc int) {
	r0, r1, r2, r3 := a[:kc], a[lda:][:kc], a[2*lda:][:kc], a[3*lda:][:kc]
	r4, r5, r6, r7 := a[4*lda:][:kc], a[5*lda:][:kc], a[6*lda:][:kc], a[7*lda:][:kc]
	d = d[:8*kc]
	for k := range r0 {
		dk := d[8*k : 8*k+8 : 8*k+8]
		dk[0], dk[1], dk[2], dk[3] = r0[k], r1[k], r2[k], r3[k]
		dk[4], dk[5], dk[6], dk[7] = r4[k], r5[k], r6[k], r7[k]
	}
}

// packBTrans32, when set, packs one float32 panel of a transposed B (cols rows of
// b from row j0, kc values from column k0) into d with row length nr, and reports
// whether it could.
var packBTrans32 func(d, b []float32, ldb, k0, kc, j0, cols, nr int) bool
