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
func sgemmAVX512x12(kc int, a, b *float32, ldb int, c *float32, ldc int, mr int, mask uint64, alpha, beta float32)

// transpose16x16pf sets dst[k*ldd+j] = src[j*lds+k] for j, k < 16 (AVX-512F),
// and prefetches (PREFETCHT1) one cache line in each of 16 rows of pf, lds
// apart.
//
//go:noescape
func transpose16x16pf(dst *float32, ldd int, src *float32, lds int, pf *float32)

// The Bias variants store c = alpha·acc + bias[j] for every row (c is not read).
//
//go:noescape
func sgemmAVX512Bias(kc int, a, b *float32, ldb int, c *float32, ldc int, mr int, mask uint64, alpha float32, bias *float32)

//go:noescape
func sgemmAVX512x12Bias(kc int, a, b *float32, ldb int, c *float32, ldc int, mr int, mask uint64, alpha float32, bias *float32)

//go:noescape
func dgemmAVX512(kc int, a, b *float64, ldb int, c *float64, ldc int, mr int, mask uint64, alpha, beta float64)

//go:noescape
func sgemmAVX2(kc int, a, b *float32, ldb int, c *float32, ldc int, mr int, mask uint64, alpha, beta float32)

//go:noescape
func dgemmAVX2(kc int, a, b *float64, ldb int, c *float64, ldc int, mr int, mask uint64, alpha, beta float64)

func init() {
	// Lists are best first and end with the portable Go kernel. The float64 list
	// has one entry per float32 entry, under the same names.
	var k32 []*ukernel[float32]
	var k64 []*ukernel[float64]
	if cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL {
		packBTrans32 = packBTransAVX512
		d := &ukernel[float64]{name: "avx512", mr: 8, nr: 24, masked: true, fn: dgemmAVX512, mc: 128, kc: 512, nc: 2040}
		k32 = append(k32,
			&ukernel[float32]{name: "avx512", mr: 8, nr: 48, masked: true, fn: sgemmAVX512, biasFn: sgemmAVX512Bias, mc: 96, kc: 1024, nc: 4128},
			&ukernel[float32]{name: "avx512x12", mr: 12, nr: 32, masked: true, fn: sgemmAVX512x12, biasFn: sgemmAVX512x12Bias, mc: 96, kc: 1024, nc: 4096})
		d12 := *d
		d12.name = "avx512x12"
		k64 = append(k64, d, &d12)
	}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		k32 = append(k32, &ukernel[float32]{name: "avx2", mr: 6, nr: 16, fn: sgemmAVX2, mc: 144, kc: 512, nc: 4080})
		k64 = append(k64, &ukernel[float64]{name: "avx2", mr: 6, nr: 8, fn: dgemmAVX2, mc: 96, kc: 512, nc: 2040})
	}
	kernels32 = append(k32, kernels32...)
	kernels64 = append(k64, kernels64...)
}

// packBTransAVX512 packs a transposed float32 B panel with 16×16 register
// transposes, prefetching the source pfDist values ahead; see packBTrans32.
func packBTransAVX512(d, b []float32, ldb, k0, kc, j0, cols, nr int) bool {
	if cols%16 != 0 || nr%16 != 0 {
		return false
	}
	k16 := kc / 16 * 16
	for j := 0; j < cols; j += 16 {
		src := b[(j0+j)*ldb+k0:]
		_ = src[15*ldb+kc-1]
		for k := 0; k < k16; k += 16 {
			// pf: the same 16 rows pfDist values further along K or, near the
			// end of K, the next 16 rows' first values (else src again).
			pf := &src[k]
			if n := k + pfDist; n < kc {
				pf = &src[n]
			} else if n-kc < kc && j+16 < cols {
				pf = &src[16*ldb+n-kc]
			}
			transpose16x16pf(&d[k*nr+j], nr, &src[k], ldb, pf)
		}
		for k := k16; k < kc; k++ {
			for r := 0; r < 16; r++ {
				d[k*nr+j+r] = src[r*ldb+k]
			}
		}
	}
	return true
}

// pfDist is how far ahead along K (floats) packBTransAVX512 prefetches its
// source rows: the rows of a transposed B are read 16 at a time, one cache line
// each, a pattern the hardware prefetchers follow poorly when B comes from
// memory (a grouped GEMM's expert weights).
var pfDist = 128
