//go:build amd64 && !noasm

#include "textflag.h"
#include "go_asm.h"

// bfloat16 helpers for the AVX-512 paths (AVX512F and BW). Rounding to
// bfloat16 is tensor.ToBF16's, in integer arithmetic: (u + 0x7fff + (u>>16 & 1))
// >> 16, and u>>16 | 0x40 for NaN.

// ROUND16 rounds the 16 floats of zmm a to bfloat16 in the low words of t.
// Z26 = 1, Z27 = 0x7fff, Z28 = 0x40 (dwords); clobbers K4.
#define ROUND16(a, t) \
	VPSRLD $16, a, t              \
	VPANDD Z26, t, t              \
	VPADDD Z27, t, t              \
	VPADDD a, t, t                \
	VPSRLD $16, t, t              \
	VCMPPS $3, a, a, K4           \
	VPSRLD $16, a, K4, t          \
	VPORD Z28, t, K4, t

#define ROUNDCONSTS \
	MOVL $1, R13                  \
	VPBROADCASTD R13, Z26         \
	MOVL $0x7fff, R13             \
	VPBROADCASTD R13, Z27         \
	MOVL $0x40, R13               \
	VPBROADCASTD R13, Z28

// func epiRowsAVX512(rows, cols int, src *float32, lds int, e *epi16)
// The output stage of epi16 on rows×cols float32 results src (leading dim lds).
TEXT ·epiRowsAVX512(SB), NOSPLIT, $0-40
	MOVQ rows+0(FP), R8
	MOVQ cols+8(FP), CX
	TESTQ R8, R8
	JZ edone
	TESTQ CX, CX
	JZ edone
	MOVQ src+16(FP), SI
	MOVQ lds+24(FP), DX
	SHLQ $2, DX
	MOVQ e+32(FP), DI
	ROUNDCONSTS
	VBROADCASTSS epi16_alpha(DI), Z24
	VBROADCASTSS epi16_beta(DI), Z25
	// K2: a full chunk; K3: the last partial chunk.
	MOVL $0xffff, AX
	KMOVW AX, K2
	MOVQ CX, R12
	ANDQ $15, CX
	MOVQ $1, AX
	SHLQ CX, AX
	DECQ AX
	KMOVW AX, K3
	MOVQ R12, CX
	MOVQ epi16_flags(DI), R11
	MOVL epi16_beta(DI), R12
	ANDL $0x7fffffff, R12
	JZ ebeta0
	ORQ $0x100, R11               // the beta term is read
ebeta0:
	MOVQ epi16_out(DI), R9
	MOVQ epi16_ldOut(DI), R12
	MOVQ epi16_in(DI), R10
	MOVQ epi16_ldIn(DI), R13
	MOVQ epi16_bias(DI), BX
erow:
	XORQ AX, AX
ecol:
	MOVQ CX, DI
	SUBQ AX, DI
	CMPQ DI, $16
	JLT etailmask
	KMOVW K2, K1
	JMP eload
etailmask:
	KMOVW K3, K1
eload:
	VMOVUPS.Z (SI)(AX*4), K1, Z0
	VMULPS Z24, Z0, Z0
	TESTQ BX, BX
	JZ enobias
	TESTQ $const_epiBiasBF16, R11
	JNZ ebiasbf
	VMOVUPS.Z (BX)(AX*4), K1, Z1
	JMP ebiasadd
ebiasbf:
	VPMOVZXWD.Z (BX)(AX*2), K1, Z1
	VPSLLD $16, Z1, Z1
ebiasadd:
	VADDPS Z1, Z0, Z0
enobias:
	TESTQ $0x100, R11
	JZ enobeta
	TESTQ $const_epiInBF16, R11
	JNZ einbf
	VMOVUPS.Z (R10)(AX*4), K1, Z1
	JMP einadd
einbf:
	VPMOVZXWD.Z (R10)(AX*2), K1, Z1
	VPSLLD $16, Z1, Z1
einadd:
	VFMADD231PS Z25, Z1, Z0
enobeta:
	TESTQ $const_epiOutBF16, R11
	JNZ eoutbf
	VMOVUPS Z0, K1, (R9)(AX*4)
	JMP enext
eoutbf:
	ROUND16(Z0, Z2)
	VPMOVDW Z2, K1, (R9)(AX*2)
enext:
	ADDQ $16, AX
	CMPQ AX, CX
	JLT ecol
	ADDQ DX, SI
	ADDQ R12, R9
	ADDQ R13, R10
	DECQ R8
	JNZ erow
	VZEROUPPER
edone:
	RET

// func cvtToF32AVX512(dst *float32, src *bf16, n int)
TEXT ·cvtToF32AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ CX, DX
	SHRQ $5, DX
	JZ wtail
wloop:
	VPMOVZXWD (SI), Z0
	VPMOVZXWD 32(SI), Z1
	VPSLLD $16, Z0, Z0
	VPSLLD $16, Z1, Z1
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	ADDQ $64, SI
	ADDQ $128, DI
	DECQ DX
	JNZ wloop
wtail:
	ANDQ $31, CX
	JZ wdone
	CMPQ CX, $16
	JLT wlast
	VPMOVZXWD (SI), Z0
	VPSLLD $16, Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $32, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JZ wdone
wlast:
	MOVQ $1, AX
	SHLQ CX, AX
	DECQ AX
	KMOVW AX, K1
	VPMOVZXWD.Z (SI), K1, Z0
	VPSLLD $16, Z0, Z0
	VMOVUPS Z0, K1, (DI)
wdone:
	VZEROUPPER
	RET

// func cvtToBF16AVX512(dst *bf16, src *float32, n int)
TEXT ·cvtToBF16AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	ROUNDCONSTS
	MOVQ CX, DX
	SHRQ $5, DX
	JZ ntail
nloop:
	VMOVUPS (SI), Z0
	VMOVUPS 64(SI), Z1
	ROUND16(Z0, Z2)
	ROUND16(Z1, Z3)
	VPMOVDW Z2, (DI)
	VPMOVDW Z3, 32(DI)
	ADDQ $128, SI
	ADDQ $64, DI
	DECQ DX
	JNZ nloop
ntail:
	ANDQ $31, CX
	JZ ndone
	CMPQ CX, $16
	JLT nlast
	VMOVUPS (SI), Z0
	ROUND16(Z0, Z2)
	VPMOVDW Z2, (DI)
	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, CX
	JZ ndone
nlast:
	MOVQ $1, AX
	SHLQ CX, AX
	DECQ AX
	KMOVW AX, K1
	VMOVUPS.Z (SI), K1, Z0
	ROUND16(Z0, Z2)
	VPMOVDW Z2, K1, (DI)
ndone:
	VZEROUPPER
	RET

// func baxpy4W(n int, x *[4]float32, b *bf16, ldb int, acc *float32)
// acc[j] = fma(x3, b3[j], fma(x2, b2[j], fma(x1, b1[j], fma(x0, b0[j], acc[j]))))
// for j < n, bi row i of b (leading dim ldb), widened.
TEXT ·baxpy4W(SB), NOSPLIT, $0-40
	MOVQ n+0(FP), CX
	MOVQ x+8(FP), SI
	MOVQ b+16(FP), R8
	MOVQ ldb+24(FP), DX
	SHLQ $1, DX
	MOVQ acc+32(FP), DI
	LEAQ (R8)(DX*1), R9
	LEAQ (R9)(DX*1), R10
	LEAQ (R10)(DX*1), R11
	VBROADCASTSS 0(SI), Z4
	VBROADCASTSS 4(SI), Z5
	VBROADCASTSS 8(SI), Z6
	VBROADCASTSS 12(SI), Z7
	XORQ AX, AX
	MOVQ CX, BX
	SHRQ $4, BX
	JZ a4tail
a4loop:
	VMOVUPS (DI)(AX*4), Z0
	VPMOVZXWD (R8)(AX*2), Z1
	VPMOVZXWD (R9)(AX*2), Z2
	VPSLLD $16, Z1, Z1
	VPSLLD $16, Z2, Z2
	VFMADD231PS Z4, Z1, Z0
	VPMOVZXWD (R10)(AX*2), Z1
	VFMADD231PS Z5, Z2, Z0
	VPMOVZXWD (R11)(AX*2), Z2
	VPSLLD $16, Z1, Z1
	VPSLLD $16, Z2, Z2
	VFMADD231PS Z6, Z1, Z0
	VFMADD231PS Z7, Z2, Z0
	VMOVUPS Z0, (DI)(AX*4)
	ADDQ $16, AX
	DECQ BX
	JNZ a4loop
a4tail:
	ANDQ $15, CX
	JZ a4done
	MOVQ $1, BX
	SHLQ CX, BX
	DECQ BX
	KMOVW BX, K1
	VMOVUPS.Z (DI)(AX*4), K1, Z0
	VPMOVZXWD.Z (R8)(AX*2), K1, Z1
	VPMOVZXWD.Z (R9)(AX*2), K1, Z2
	VPSLLD $16, Z1, Z1
	VPSLLD $16, Z2, Z2
	VFMADD231PS Z4, Z1, Z0
	VPMOVZXWD.Z (R10)(AX*2), K1, Z1
	VFMADD231PS Z5, Z2, Z0
	VPMOVZXWD.Z (R11)(AX*2), K1, Z2
	VPSLLD $16, Z1, Z1
	VPSLLD $16, Z2, Z2
	VFMADD231PS Z6, Z1, Z0
	VFMADD231PS Z7, Z2, Z0
	VMOVUPS Z0, K1, (DI)(AX*4)
a4done:
	VZEROUPPER
	RET

// func baxpy1W(n int, x float32, b *bf16, acc *float32)
// acc[j] = fma(x, b[j], acc[j]) for j < n.
TEXT ·baxpy1W(SB), NOSPLIT, $0-32
	MOVQ n+0(FP), CX
	VBROADCASTSS x+8(FP), Z4
	MOVQ b+16(FP), R8
	MOVQ acc+24(FP), DI
	XORQ AX, AX
	MOVQ CX, BX
	SHRQ $4, BX
	JZ a1tail
a1loop:
	VMOVUPS (DI)(AX*4), Z0
	VPMOVZXWD (R8)(AX*2), Z1
	VPSLLD $16, Z1, Z1
	VFMADD231PS Z4, Z1, Z0
	VMOVUPS Z0, (DI)(AX*4)
	ADDQ $16, AX
	DECQ BX
	JNZ a1loop
a1tail:
	ANDQ $15, CX
	JZ a1done
	MOVQ $1, BX
	SHLQ CX, BX
	DECQ BX
	KMOVW BX, K1
	VMOVUPS.Z (DI)(AX*4), K1, Z0
	VPMOVZXWD.Z (R8)(AX*2), K1, Z1
	VPSLLD $16, Z1, Z1
	VFMADD231PS Z4, Z1, Z0
	VMOVUPS Z0, K1, (DI)(AX*4)
a1done:
	VZEROUPPER
	RET

// func pairRows(dst *float32, ldd int, src *bf16, lds int, pairs, chunks int, lmask, smask uint64)
// Interleaves pairs of rows of src into 32-bit lanes: for p < pairs and j <
// 16·chunks (chunks <= 4), dst[p*ldd+j] = src[2p*lds+j] | src[(2p+1)*lds+j]<<16
// where bit j of lmask is set, else 0; the last chunk stores the lanes set in
// smask (its 16 bits). ldd is in lanes, lds in elements.
TEXT ·pairRows(SB), NOSPLIT, $0-64
	MOVQ dst+0(FP), DI
	MOVQ ldd+8(FP), DX
	SHLQ $2, DX
	MOVQ src+16(FP), SI
	MOVQ lds+24(FP), R8
	SHLQ $1, R8
	LEAQ (SI)(R8*1), R9
	SHLQ $1, R8
	MOVQ pairs+32(FP), CX
	TESTQ CX, CX
	JZ pdone
	MOVQ chunks+40(FP), R10
	MOVQ lmask+48(FP), AX
	KMOVQ AX, K1
	KSHIFTRQ $16, K1, K2
	KSHIFTRQ $32, K1, K3
	KSHIFTRQ $48, K1, K4
	MOVQ smask+56(FP), AX
	KMOVQ AX, K5
ploop:
	VPMOVZXWD.Z (SI), K1, Z0
	VPMOVZXWD.Z (R9), K1, Z1
	VPSLLD $16, Z1, Z1
	VPORD Z1, Z0, Z0
	CMPQ R10, $1
	JEQ plast0
	VMOVDQU32 Z0, (DI)
	VPMOVZXWD.Z 32(SI), K2, Z0
	VPMOVZXWD.Z 32(R9), K2, Z1
	VPSLLD $16, Z1, Z1
	VPORD Z1, Z0, Z0
	CMPQ R10, $2
	JEQ plast1
	VMOVDQU32 Z0, 64(DI)
	VPMOVZXWD.Z 64(SI), K3, Z0
	VPMOVZXWD.Z 64(R9), K3, Z1
	VPSLLD $16, Z1, Z1
	VPORD Z1, Z0, Z0
	CMPQ R10, $3
	JEQ plast2
	VMOVDQU32 Z0, 128(DI)
	VPMOVZXWD.Z 96(SI), K4, Z0
	VPMOVZXWD.Z 96(R9), K4, Z1
	VPSLLD $16, Z1, Z1
	VPORD Z1, Z0, Z0
	VMOVDQU32 Z0, K5, 192(DI)
	JMP pnext
plast0:
	VMOVDQU32 Z0, K5, (DI)
	JMP pnext
plast1:
	VMOVDQU32 Z0, K5, 64(DI)
	JMP pnext
plast2:
	VMOVDQU32 Z0, K5, 128(DI)
pnext:
	ADDQ R8, SI
	ADDQ R8, R9
	ADDQ DX, DI
	DECQ CX
	JNZ ploop
	VZEROUPPER
pdone:
	RET

// func pairRowsSplit(dst *float32, pstride int, src *bf16, lds int, pairs, chunks int)
// pairRows for 8-lane panels pstride bytes apart, 16 columns (two panels) per
// chunk: for p < pairs, c < chunks, j < 16, with v = src[2p*lds+16c+j] |
// src[(2p+1)*lds+16c+j]<<16: panel 2c+j/8 gets v at lane 8p + j%8. lds is in
// elements. A transposed A (K×M) packed into panels of 8 rows of op(A).
TEXT ·pairRowsSplit(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ pstride+8(FP), DX
	MOVQ src+16(FP), SI
	MOVQ lds+24(FP), R8
	SHLQ $1, R8
	LEAQ (SI)(R8*1), R9
	SHLQ $1, R8
	MOVQ pairs+32(FP), CX
	MOVQ chunks+40(FP), R10
	TESTQ CX, CX
	JZ sdone
	TESTQ R10, R10
	JZ sdone
	LEAQ (DX)(DX*1), R12          // two panels
sloop:
	MOVQ DI, R11
	XORQ AX, AX
	MOVQ R10, BX
schunk:
	VPMOVZXWD (SI)(AX*1), Z0
	VPMOVZXWD (R9)(AX*1), Z1
	VPSLLD $16, Z1, Z1
	VPORD Z1, Z0, Z0
	VMOVUPS Y0, (R11)
	VEXTRACTF32X8 $1, Z0, (R11)(DX*1)
	ADDQ $32, AX
	ADDQ R12, R11
	DECQ BX
	JNZ schunk
	ADDQ R8, SI
	ADDQ R8, R9
	ADDQ $32, DI
	DECQ CX
	JNZ sloop
	VZEROUPPER
sdone:
	RET

// func colSumBF16(acc *float32, a *bf16, lda, rows, n int)
// acc[j] += a[i*lda+j] for each row i in order, j < n: row by row, so every
// acc[j] sees the same additions in the same order as a scalar loop.
TEXT ·colSumBF16(SB), NOSPLIT, $0-40
	MOVQ acc+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ lda+16(FP), DX
	SHLQ $1, DX
	MOVQ rows+24(FP), R8
	MOVQ n+32(FP), CX
	TESTQ R8, R8
	JZ cdone
	TESTQ CX, CX
	JZ cdone
	MOVQ CX, R9
	ANDQ $15, R9
	MOVQ $1, AX
	MOVQ CX, R10
	MOVQ R9, CX
	SHLQ CX, AX
	DECQ AX
	KMOVW AX, K1                  // the last partial chunk
	MOVQ R10, CX
	SHRQ $4, R10                  // whole chunks
crow:
	XORQ AX, AX
	MOVQ R10, BX
	TESTQ BX, BX
	JZ ctail
cchunk:
	VPMOVZXWD (SI)(AX*2), Z0
	VPSLLD $16, Z0, Z0
	VADDPS (DI)(AX*4), Z0, Z0
	VMOVUPS Z0, (DI)(AX*4)
	ADDQ $16, AX
	DECQ BX
	JNZ cchunk
ctail:
	TESTQ R9, R9
	JZ cnext
	VPMOVZXWD.Z (SI)(AX*2), K1, Z0
	VPSLLD $16, Z0, Z0
	VMOVUPS.Z (DI)(AX*4), K1, Z1
	VADDPS Z1, Z0, Z0
	VMOVUPS Z0, K1, (DI)(AX*4)
cnext:
	ADDQ DX, SI
	DECQ R8
	JNZ crow
	VZEROUPPER
cdone:
	RET

// func unpairRows(dst *float32, src *float32, n, pairs, chunks int, smask uint64)
// Widens a panel of bfloat16 pairs (rows of n 32-bit lanes) into float32 rows
// of n: for p < pairs, dst[2p*n+j] = float32(lo(src[p*n+j])),
// dst[(2p+1)*n+j] = float32(hi(src[p*n+j])), j < n = 16·chunks, the last chunk
// storing the lanes of smask (chunks <= 4).
TEXT ·unpairRows(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), DX
	SHLQ $2, DX                   // a row in bytes
	MOVQ pairs+24(FP), CX
	MOVQ chunks+32(FP), R10
	MOVQ smask+40(FP), AX
	KMOVQ AX, K1
	TESTQ CX, CX
	JZ udone
	MOVL $0xffff0000, AX
	VPBROADCASTD AX, Z31
	LEAQ (DI)(DX*1), R9           // the odd row
uloop:
	VMOVDQU32 (SI), Z0
	CMPQ R10, $1
	JEQ u1
	VMOVDQU32 64(SI), Z1
	CMPQ R10, $2
	JEQ u2
	VMOVDQU32 128(SI), Z2
	CMPQ R10, $3
	JEQ u3
	VMOVDQU32 192(SI), Z3
	VPSLLD $16, Z3, Z7
	VPANDD Z31, Z3, Z3
	VMOVDQU32 Z7, K1, 192(DI)
	VMOVDQU32 Z3, K1, 192(R9)
	VPSLLD $16, Z2, Z6
	VPANDD Z31, Z2, Z2
	VMOVDQU32 Z6, 128(DI)
	VMOVDQU32 Z2, 128(R9)
	JMP ufull2
u3:
	VPSLLD $16, Z2, Z6
	VPANDD Z31, Z2, Z2
	VMOVDQU32 Z6, K1, 128(DI)
	VMOVDQU32 Z2, K1, 128(R9)
ufull2:
	VPSLLD $16, Z1, Z5
	VPANDD Z31, Z1, Z1
	VMOVDQU32 Z5, 64(DI)
	VMOVDQU32 Z1, 64(R9)
	JMP ufull1
u2:
	VPSLLD $16, Z1, Z5
	VPANDD Z31, Z1, Z1
	VMOVDQU32 Z5, K1, 64(DI)
	VMOVDQU32 Z1, K1, 64(R9)
ufull1:
	VPSLLD $16, Z0, Z4
	VPANDD Z31, Z0, Z0
	VMOVDQU32 Z4, (DI)
	VMOVDQU32 Z0, (R9)
	JMP unext
u1:
	VPSLLD $16, Z0, Z4
	VPANDD Z31, Z0, Z0
	VMOVDQU32 Z4, K1, (DI)
	VMOVDQU32 Z0, K1, (R9)
unext:
	ADDQ DX, SI
	LEAQ (DI)(DX*2), DI
	LEAQ (R9)(DX*2), R9
	DECQ CX
	JNZ uloop
	VZEROUPPER
udone:
	RET
