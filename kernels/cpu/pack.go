package cpu

// packA copies op(A)[i0:i0+mc, k0:k0+kc] into dst as panels of mr rows: panel p
// holds, for each k, the mr values op(A)[i0+p*mr+i][k0+k], zero past row mc.
func packA[T float](dst, a []T, lda int, trans bool, i0, mc, k0, kc, mr int) {
	for p := 0; p < mc; p += mr {
		rows := min(mr, mc-p)
		d := dst[(p/mr)*kc*mr:][:kc*mr]
		if !trans {
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
			continue
		}
		// A is stored K×M: op(A)[i][k] = a[k*lda+i].
		for k := 0; k < kc; k++ {
			dk := d[k*mr : k*mr+mr]
			copy(dk, a[(k0+k)*lda+i0+p:][:rows])
			clear(dk[rows:])
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
			for k := 0; k < kc; k++ {
				dk := d[k*nr : k*nr+nr]
				copy(dk, b[(k0+k)*ldb+j0+q:][:cols])
				clear(dk[cols:])
			}
			continue
		}
		// B is stored N×K: op(B)[k][j] = b[j*ldb+k].
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
