//go:build amd64 && !noasm

package cpu

import (
	"math"

	"golang.org/x/sys/cpu"
)

// lnSums4 sums four rows' first 4·blocks elements in four lanes each
// (lane k: the elements 4j + k, in order): the elements themselves, or with
// mean their squared deviations from it.
//
//go:noescape
func lnSums4(r0, r1, r2, r3 *float32, blocks int, mean *[4]float64, out *[16]float64)

// lnOut writes one row of the output: y[i] = ((x[i] − m)·s)·gamma[i],
// plus beta[i] where beta is not nil, for i < n.
//
//go:noescape
func lnOut(y, x, gamma, beta *float32, n int, m, s float32)

func init() {
	if cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL {
		lnForward32 = layerNormVec
	}
}

// layerNormVec is layerNorm on float32 rows lo..hi of width d (at least
// 16), four rows at a time: lnSums4's lanes are the Go loop's four
// accumulators, the columns past the last block of four are added to the
// first in Go as there, and lnOut writes the rows: the Go loop's result bit
// for bit.
func layerNormVec(y, stats, x, gamma, beta []float32, d, lo, hi int, eps float64) {
	blocks, tail := d/4, d/4*4
	g := gamma[:d]
	var b *float32
	if beta != nil {
		b = &beta[:d][0]
	}
	var sums [16]float64
	var means [4]float64
	for r := lo; r < hi; r += 4 {
		nr := min(4, hi-r)
		var rows [4]*float32
		for k := range rows {
			rows[k] = &x[(r+min(k, nr-1))*d : (r+min(k, nr-1)+1)*d][0]
		}
		lnSums4(rows[0], rows[1], rows[2], rows[3], blocks, nil, &sums)
		for k := range nr {
			xr := x[(r+k)*d:][:d]
			s0 := sums[4*k]
			for _, v := range xr[tail:] {
				s0 += float64(v)
			}
			means[k] = ((s0 + sums[4*k+1]) + (sums[4*k+2] + sums[4*k+3])) / float64(d)
		}
		for k := nr; k < 4; k++ {
			means[k] = means[nr-1]
		}
		lnSums4(rows[0], rows[1], rows[2], rows[3], blocks, &means, &sums)
		for k := range nr {
			xr := x[(r+k)*d:][:d]
			s0 := sums[4*k]
			for _, v := range xr[tail:] {
				c := float64(v) - means[k]
				s0 += c * c
			}
			rstd := 1 / math.Sqrt(((s0+sums[4*k+1])+(sums[4*k+2]+sums[4*k+3]))/float64(d)+eps)
			m, s := float32(means[k]), float32(rstd)
			lnOut(&y[(r+k)*d:][:d][0], &xr[0], &g[0], b, d, m, s)
			stats[2*(r+k)], stats[2*(r+k)+1] = m, s
		}
	}
}

// lnBwdRows is four rows for lnDxSums4: their dy and x, their mean and
// 1/σ.
type lnBwdRows struct {
	dy, x [4]*float32
	m, s  [4]float32
}

//go:noescape
func lnDxSums4(r *lnBwdRows, gamma *float32, blocks int, out *[32]float64)

//go:noescape
func lnDxOut(dx, dy, x, gamma *float32, n int, k *[4]float32)

//go:noescape
func lnCols(gsum, bsum *float64, dy, x *float32, n int, m, s float32)

func init() {
	if cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL {
		lnDx32 = lnDxVec
		lnColumns32 = func(g, b []float64, dy, x []float32, m, s float32) {
			if n := len(dy); n > 0 {
				_, _, _ = g[n-1], b[n-1], x[n-1]
				lnCols(&g[0], &b[0], &dy[0], &x[0], n, m, s)
			}
		}
	}
}

// lnDxVec is lnDx on float32 rows lo..hi of width d (at least 16), four
// rows at a time, as layerNormVec does the forward: the Go loop's result bit
// for bit.
func lnDxVec(dx, dy, x, gamma, stats []float32, d, lo, hi int) {
	blocks, tail := d/4, d/4*4
	g := gamma[:d]
	var rs lnBwdRows
	var sums [32]float64
	for r := lo; r < hi; r += 4 {
		nr := min(4, hi-r)
		for j := range 4 {
			q := r + min(j, nr-1)
			rs.dy[j], rs.x[j] = &dy[q*d:][:d][0], &x[q*d:][:d][0]
			rs.m[j], rs.s[j] = stats[2*q], stats[2*q+1]
		}
		lnDxSums4(&rs, &g[0], blocks, &sums)
		for j := range nr {
			q := r + j
			m, s := rs.m[j], rs.s[j]
			xr, dyr := x[q*d:][:d], dy[q*d:][:d]
			a0, b0 := sums[8*j], sums[8*j+4]
			for i := tail; i < d; i++ {
				gi := float64(dyr[i] * g[i])
				a0 += gi
				b0 += gi * float64((xr[i]-m)*s)
			}
			a := float32(((a0 + sums[8*j+1]) + (sums[8*j+2] + sums[8*j+3])) / float64(d))
			b := float32(((b0 + sums[8*j+5]) + (sums[8*j+6] + sums[8*j+7])) / float64(d))
			k := [4]float32{m, s, a, b}
			lnDxOut(&dx[q*d:][:d][0], &dyr[0], &xr[0], &g[0], d, &k)
		}
	}
}
