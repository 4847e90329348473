//go:build amd64 && !noasm

package cpu

import "golang.org/x/sys/cpu"

// geluForwardAVX512 sets y[i] = gelu(x[i]) for i < n, n a multiple of 16.
//
//go:noescape
func geluForwardAVX512(y, x *float32, n int)

// geluBackwardAVX512 sets dx[i] = dy[i]·gelu'(x[i]) for i < n, n a multiple of 16.
//
//go:noescape
func geluBackwardAVX512(dx, dy, x *float32, n int)

func init() {
	if cpu.X86.HasAVX512F && cpu.X86.HasAVX512DQ {
		geluBlocks = geluBlocksAVX512
	}
}

func geluBlocksAVX512(y, dy, x []float32, backward bool) {
	if len(x) == 0 {
		return
	}
	if backward {
		geluBackwardAVX512(&y[0], &dy[0], &x[0], len(x))
	} else {
		geluForwardAVX512(&y[0], &x[0], len(x))
	}
}
