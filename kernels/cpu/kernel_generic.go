package cpu

import (
	"math/bits"
	"unsafe"
)

type float interface{ ~float32 | ~float64 }

// ukernel is one register-blocked micro-kernel and the cache blocking that goes
// with it: mc×kc panels of A (L2), kc×nc panels of B (L3), kc×nr micro-panels of
// B (L1).
type ukernel[T float] struct {
	name   string
	mr, nr int
	// masked kernels store partial tiles (rows < mr, columns set in mask) themselves;
	// the others compute full tiles only and the driver goes through a scratch tile.
	masked bool
	fn     func(kc int, a, b *T, ldb int, c *T, ldc int, mr int, mask uint64, alpha, beta T)
	// biasFn, if set (masked kernels only), is fn with c = alpha·acc + bias[j]
	// instead of beta·c: the linear layer's bias fused into the first K block.
	biasFn     func(kc int, a, b *T, ldb int, c *T, ldc int, mr int, mask uint64, alpha T, bias *T)
	mc, kc, nc int
}

// kernels32 and kernels64 list the micro-kernels this machine can run, best
// first; the portable Go kernel is always last.
var (
	kernels32 = []*ukernel[float32]{{name: "go", mr: 4, nr: 4, masked: true, fn: goKernel[float32], mc: 128, kc: 256, nc: 1024}}
	kernels64 = []*ukernel[float64]{{name: "go", mr: 4, nr: 4, masked: true, fn: goKernel[float64], mc: 128, kc: 256, nc: 1024}}
)

// goKernel is the portable 4×4 micro-kernel (the reference for the assembly ones):
//
//	acc[i][j] = Σ_{k<kc} a[k*4+i]·b[k*ldb+j]
//	c[i*ldc+j] = alpha·acc[i][j] + beta·c[i*ldc+j] for i < mr and mask bit j set
//
// c is not read when beta == 0.
func goKernel[T float](kc int, a, b *T, ldb int, c *T, ldc int, mr int, mask uint64, alpha, beta T) {
	as := unsafe.Slice(a, 4*kc)
	bs := unsafe.Slice(b, (kc-1)*ldb+4)
	var c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33 T
	for k := 0; k < kc; k++ {
		av := as[4*k : 4*k+4 : 4*k+4]
		bv := bs[k*ldb : k*ldb+4 : k*ldb+4]
		a0, a1, a2, a3 := av[0], av[1], av[2], av[3]
		b0, b1, b2, b3 := bv[0], bv[1], bv[2], bv[3]
		c00 += a0 * b0
		c01 += a0 * b1
		c02 += a0 * b2
		c03 += a0 * b3
		c10 += a1 * b0
		c11 += a1 * b1
		c12 += a1 * b2
		c13 += a1 * b3
		c20 += a2 * b0
		c21 += a2 * b1
		c22 += a2 * b2
		c23 += a2 * b3
		c30 += a3 * b0
		c31 += a3 * b1
		c32 += a3 * b2
		c33 += a3 * b3
	}
	acc := [4][4]T{{c00, c01, c02, c03}, {c10, c11, c12, c13}, {c20, c21, c22, c23}, {c30, c31, c32, c33}}
	cs := unsafe.Slice(c, (mr-1)*ldc+bits.Len64(mask))
	for i := 0; i < mr; i++ {
		row := cs[i*ldc:]
		for j := 0; j < 4; j++ {
			if mask&(1<<j) == 0 {
				continue
			}
			if beta == 0 {
				row[j] = alpha * acc[i][j]
			} else {
				row[j] = alpha*acc[i][j] + beta*row[j]
			}
		}
	}
}
