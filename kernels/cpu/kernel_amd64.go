//go:build amd64 && !noasm

package cpu

import "golang.org/x/sys/cpu"

//go:generate go run ./internal/asmgen -out kernel_amd64.s

// The assembly micro-kernels; see internal/asmgen for their contract. Reference:
//
//	for i < MR, j < NR: acc = Σ_k a[k*MR+i]*b[k*ldb+j]; c[i*ldc+j] = alpha*acc + beta*c[i*ldc+j]

//go:noescape
func sgemmAVX512(kc int, a, b *float32, ldb int, c *float32, ldc int, mr int, mask uint64, alpha, beta float32)

//go:noescape
func dgemmAVX512(kc int, a, b *float64, ldb int, c *float64, ldc int, mr int, mask uint64, alpha, beta float64)

//go:noescape
func sgemmAVX2(kc int, a, b *float32, ldb int, c *float32, ldc int, mr int, mask uint64, alpha, beta float32)

//go:noescape
func dgemmAVX2(kc int, a, b *float64, ldb int, c *float64, ldc int, mr int, mask uint64, alpha, beta float64)

func init() {
	hasAVX512 := cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL
	if hasAVX512 {
		kernels32 = append([]*ukernel[float32]{{name: "avx512", mr: 8, nr: 48, masked: true, fn: sgemmAVX512,
			mc: 192, kc: 256, nc: 4032}}, kernels32...)
		kernels64 = append([]*ukernel[float64]{{name: "avx512", mr: 8, nr: 24, masked: true, fn: dgemmAVX512,
			mc: 128, kc: 256, nc: 2040}}, kernels64...)
	}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		kernels32 = insertBeforeGeneric(kernels32, &ukernel[float32]{name: "avx2", mr: 6, nr: 16, fn: sgemmAVX2,
			mc: 144, kc: 256, nc: 4080})
		kernels64 = insertBeforeGeneric(kernels64, &ukernel[float64]{name: "avx2", mr: 6, nr: 8, fn: dgemmAVX2,
			mc: 96, kc: 256, nc: 2040})
	}
}

func insertBeforeGeneric[T float](ks []*ukernel[T], k *ukernel[T]) []*ukernel[T] {
	n := len(ks)
	return append(ks[:n-1:n-1], k, ks[n-1])
}
