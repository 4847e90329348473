package cpu

import (
	"github.com/meshrun/meshrun/kernels"
)

// broadcastRows sets every row of y[m,n] to b[n].
func broadcastRows[T float](y, b []T, m, n int) {
	for i := 0; i < m; i++ {
		copy(y[i*n:(i+1)*n], b[:n])
	}
}

// columnSum computes db[j] (+)= Σ_i dy[i*n+j], rows in order.
func columnSum[T float](db, dy []T, m, n int, accumulate bool) {
	db = db[:n]
	if !accumulate {
		clear(db)
	}
	for i := 0; i < m; i++ {
		row := dy[i*n:][:n]
		for j, v := range row {
			db[j] += v
		}
	}
}

// geluForward is y = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), computed in float64.
func geluForward[T float](y, x []T) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] = T(kernels.Gelu(float64(v)))
	}
}

// geluBackward is dx = dy·gelu'(x), computed in float64.
func geluBackward[T float](dx, dy, x []T) {
	dx, dy = dx[:len(x)], dy[:len(x)]
	for i, v := range x {
		dx[i] = T(float64(dy[i]) * kernels.GeluGrad(float64(v)))
	}
}
