package cpu

import (
	"sync"

	"github.com/meshrun/meshrun/kernels"
)

// broadcastRows sets every row of c[m, ldc] to beta·c + b (to b, without reading
// c, when beta is 0).
func broadcastRows[T float](c []T, ldc int, b []T, m, n int, beta T) {
	b = b[:n]
	for i := 0; i < m; i++ {
		row := c[i*ldc:][:n]
		if beta == 0 {
			copy(row, b)
			continue
		}
		for j, v := range b {
			row[j] = beta*row[j] + v
		}
	}
}

// addScaled32, where the machine has one, is axpy's float32 loop in vector
// registers (the product rounded, then the sum: the same result).
var addScaled32 func(alpha float32, x, y []float32)

// colSum32, where the machine has one, is columnSum's float32 sum in
// vector registers (same additions in the same order: the same result).
var colSum32 func(acc, a []float32, m, n, ld int)

// columnSum computes db[j] (+)= Σ_i a[i*ld+j] over m rows, rows in order.
func columnSum[T float](db, a []T, m, n, ld int, accumulate bool) {
	db = db[:n]
	if !accumulate {
		clear(db)
	}
	if colSum32 != nil {
		if d, ok := any(db).([]float32); ok {
			colSum32(d, any(a).([]float32), m, n, ld)
			return
		}
	}
	for i := 0; i < m; i++ {
		row := a[i*ld:][:n]
		for j, v := range row {
			db[j] += v
		}
	}
}

// rowSum computes db[i] = Σ_j a[i*ld+j] over n columns.
func rowSum[T float](db, a []T, m, n, ld int) {
	if n == 0 {
		clear(db[:m])
		return
	}
	for i := 0; i < m; i++ {
		var s T
		for _, v := range a[i*ld:][:n] {
			s += v
		}
		db[i] = s
	}
}

// gelu64s is the float64 GELU: the reference formula.
func gelu64s(y, dy, x []float64, backward bool, _ int) {
	y = y[:len(x)]
	if backward {
		dy = dy[:len(x)]
		for i, v := range x {
			y[i] = dy[i] * kernels.GeluGrad(v)
		}
		return
	}
	for i, v := range x {
		y[i] = kernels.Gelu(v)
	}
}

// pieces is how many contiguous pieces an elementwise op cuts n elements into.
func pieces(n, threads int) int {
	const grain = 1 << 16
	return max(1, min(threads, (n+grain-1)/grain))
}

// pieceJob runs f on piece k = [lo, hi) of [0, n) for every piece.
type pieceJob struct {
	n, parts int
	f        func(k, lo, hi int)
}

func (j *pieceJob) run(part int) {
	lo, hi := span(j.n, j.parts, part)
	j.f(part, lo, hi)
}

// inPieces runs f over pieces(n, threads) pieces concurrently.
func inPieces(n, threads int, f func(k, lo, hi int)) {
	j := pieceJob{n: n, parts: pieces(n, threads), f: f}
	if j.parts == 1 {
		f(0, 0, n)
		return
	}
	var wg sync.WaitGroup
	parallel(&j, j.parts, &wg)
}

// axpy computes y += alpha·x in pieces.
func axpy[T float](alpha T, x, y []T, threads int) {
	x = x[:len(y)]
	inPieces(len(y), threads, func(_, lo, hi int) {
		yv, xv := y[lo:hi], x[lo:hi:hi]
		if addScaled32 != nil {
			if y32, ok := any(yv).([]float32); ok {
				addScaled32(any(alpha).(float32), any(xv).([]float32), y32)
				return
			}
		}
		for i := range yv {
			yv[i] += alpha * xv[i]
		}
	})
}

// mse sets dy = scale·(y − t) and returns Σ (y − t)², the squares summed in
// float64 per piece (four interleaved accumulators each) and the pieces added
// in order.
func mse[T float](dy, y, t []T, scale T, threads int) float64 {
	n := len(y)
	t, dy = t[:n], dy[:n]
	sums := make([]float64, pieces(n, threads))
	inPieces(n, threads, func(k, lo, hi int) {
		var acc [4]float64
		i := lo
		for ; i+4 <= hi; i += 4 {
			for j := range 4 {
				d := y[i+j] - t[i+j]
				acc[j] += float64(d * d)
				dy[i+j] = d * scale
			}
		}
		for ; i < hi; i++ {
			d := y[i] - t[i]
			acc[0] += float64(d * d)
			dy[i] = d * scale
		}
		sums[k] = (acc[0] + acc[1]) + (acc[2] + acc[3])
	})
	var sum float64
	for _, s := range sums {
		sum += s
	}
	return sum
}
