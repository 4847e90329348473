//go:build amd64 && !noasm

#include "textflag.h"
#include "tail_amd64.h"

// Layer norm's float32 loops in AVX-512, each the Go loop's operations in
// its order: a row's sums go in four float64 lanes, lane k taking elements
// 4j+k in order as the Go loop's four accumulators do, and four rows at a
// time (independent chains, so the adds' latency overlaps); nothing fused.

// func lnSums4(r0, r1, r2, r3 *float32, blocks int, mean *[4]float64, out *[16]float64)
// For j < blocks, lane k of row r: without mean (nil),
// out[4r+k] = Σ_j float64(row_r[4j+k]); with it, out[4r+k] = Σ_j c·c,
// c = float64(row_r[4j+k]) − mean[r].
TEXT ·lnSums4(SB), NOSPLIT, $0-56
	MOVQ r0+0(FP), AX
	MOVQ r1+8(FP), BX
	MOVQ r2+16(FP), CX
	MOVQ r3+24(FP), DX
	MOVQ blocks+32(FP), R8
	MOVQ mean+40(FP), R9
	MOVQ out+48(FP), DI
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3
	XORQ SI, SI
	TESTQ R8, R8
	JZ sdone
	TESTQ R9, R9
	JNZ squares
sloop:
	VCVTPS2PD (AX)(SI*1), Y4
	VCVTPS2PD (BX)(SI*1), Y5
	VCVTPS2PD (CX)(SI*1), Y6
	VCVTPS2PD (DX)(SI*1), Y7
	VADDPD Y4, Y0, Y0
	VADDPD Y5, Y1, Y1
	VADDPD Y6, Y2, Y2
	VADDPD Y7, Y3, Y3
	ADDQ $16, SI
	DECQ R8
	JNZ sloop
	JMP sdone
squares:
	VBROADCASTSD 0(R9), Y8
	VBROADCASTSD 8(R9), Y9
	VBROADCASTSD 16(R9), Y10
	VBROADCASTSD 24(R9), Y11
qloop:
	VCVTPS2PD (AX)(SI*1), Y4
	VCVTPS2PD (BX)(SI*1), Y5
	VCVTPS2PD (CX)(SI*1), Y6
	VCVTPS2PD (DX)(SI*1), Y7
	VSUBPD Y8, Y4, Y4
	VSUBPD Y9, Y5, Y5
	VSUBPD Y10, Y6, Y6
	VSUBPD Y11, Y7, Y7
	VMULPD Y4, Y4, Y4
	VMULPD Y5, Y5, Y5
	VMULPD Y6, Y6, Y6
	VMULPD Y7, Y7, Y7
	VADDPD Y4, Y0, Y0
	VADDPD Y5, Y1, Y1
	VADDPD Y6, Y2, Y2
	VADDPD Y7, Y3, Y3
	ADDQ $16, SI
	DECQ R8
	JNZ qloop
sdone:
	VMOVUPD Y0, (DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	VZEROUPPER
	RET

// func lnOut(y, x, gamma, beta *float32, n int, m, s float32)
// y[i] = ((x[i] − m)·s)·gamma[i] (+ beta[i] where beta is not nil), i < n.
TEXT ·lnOut(SB), NOSPLIT, $0-48
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ gamma+16(FP), R8
	MOVQ beta+24(FP), R9
	MOVQ n+32(FP), CX
	VBROADCASTSS m+40(FP), Z8
	VBROADCASTSS s+44(FP), Z9
	TAILMASK(4, 15)
	XORQ BX, BX
	TESTQ R10, R10
	JZ otail
oloop:
	VMOVUPS (SI)(BX*1), Z0
	VSUBPS Z8, Z0, Z0
	VMULPS Z9, Z0, Z0
	VMULPS (R8)(BX*1), Z0, Z0
	TESTQ R9, R9
	JZ ostore
	VADDPS (R9)(BX*1), Z0, Z0
ostore:
	VMOVUPS Z0, (DI)(BX*1)
	ADDQ $64, BX
	DECQ R10
	JNZ oloop
otail:
	TESTQ R11, R11
	JZ odone
	VMOVUPS.Z (SI)(BX*1), K1, Z0
	VMOVUPS.Z (R8)(BX*1), K1, Z1
	VSUBPS Z8, Z0, Z0
	VMULPS Z9, Z0, Z0
	VMULPS Z1, Z0, Z0
	TESTQ R9, R9
	JZ otstore
	VMOVUPS.Z (R9)(BX*1), K1, Z2
	VADDPS Z2, Z0, Z0
otstore:
	VMOVUPS Z0, K1, (DI)(BX*1)
odone:
	VZEROUPPER
	RET

// func lnDxSums4(r *lnBwdRows, gamma *float32, blocks int, out *[32]float64)
// For each of r's four rows and lane k, over blocks j in order, with
// gv = float64(dy·gamma) and h = float64((x − m)·s) (both products in
// float32): out[8r+k] += gv, out[8r+4+k] += gv·h.
TEXT ·lnDxSums4(SB), NOSPLIT, $0-32
	MOVQ r+0(FP), R12
	MOVQ blocks+16(FP), R13
	MOVQ out+24(FP), DI
	MOVQ 0(R12), AX
	MOVQ 8(R12), BX
	MOVQ 16(R12), CX
	MOVQ 24(R12), DX
	MOVQ 32(R12), R8
	MOVQ 40(R12), R9
	MOVQ 48(R12), R10
	MOVQ 56(R12), R11
	VBROADCASTSS 64(R12), X16
	VBROADCASTSS 68(R12), X17
	VBROADCASTSS 72(R12), X18
	VBROADCASTSS 76(R12), X19
	VBROADCASTSS 80(R12), X20
	VBROADCASTSS 84(R12), X21
	VBROADCASTSS 88(R12), X22
	VBROADCASTSS 92(R12), X23
	MOVQ gamma+8(FP), R12
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3
	VXORPD Y4, Y4, Y4
	VXORPD Y5, Y5, Y5
	VXORPD Y6, Y6, Y6
	VXORPD Y7, Y7, Y7
	XORQ SI, SI
	TESTQ R13, R13
	JZ ddone
dloop:
	VMOVUPS (R12)(SI*1), X15                 // gamma
	// row 0
	VMULPS (AX)(SI*1), X15, X8
	VCVTPS2PD X8, Y8
	VADDPD Y8, Y0, Y0
	VMOVUPS (R8)(SI*1), X9
	VSUBPS X16, X9, X9
	VMULPS X20, X9, X9
	VCVTPS2PD X9, Y9
	VMULPD Y9, Y8, Y8
	VADDPD Y8, Y1, Y1
	// row 1
	VMULPS (BX)(SI*1), X15, X10
	VCVTPS2PD X10, Y10
	VADDPD Y10, Y2, Y2
	VMOVUPS (R9)(SI*1), X11
	VSUBPS X17, X11, X11
	VMULPS X21, X11, X11
	VCVTPS2PD X11, Y11
	VMULPD Y11, Y10, Y10
	VADDPD Y10, Y3, Y3
	// row 2
	VMULPS (CX)(SI*1), X15, X12
	VCVTPS2PD X12, Y12
	VADDPD Y12, Y4, Y4
	VMOVUPS (R10)(SI*1), X13
	VSUBPS X18, X13, X13
	VMULPS X22, X13, X13
	VCVTPS2PD X13, Y13
	VMULPD Y13, Y12, Y12
	VADDPD Y12, Y5, Y5
	// row 3
	VMULPS (DX)(SI*1), X15, X8
	VCVTPS2PD X8, Y8
	VADDPD Y8, Y6, Y6
	VMOVUPS (R11)(SI*1), X9
	VSUBPS X19, X9, X9
	VMULPS X23, X9, X9
	VCVTPS2PD X9, Y9
	VMULPD Y9, Y8, Y8
	VADDPD Y8, Y7, Y7
	ADDQ $16, SI
	DECQ R13
	JNZ dloop
ddone:
	VMOVUPD Y0, (DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	VMOVUPD Y4, 128(DI)
	VMOVUPD Y5, 160(DI)
	VMOVUPD Y6, 192(DI)
	VMOVUPD Y7, 224(DI)
	VZEROUPPER
	RET

// func lnDxOut(dx, dy, x, gamma *float32, n int, k *[4]float32)
// k: m, s, a, b. dx[i] = s·((dy[i]·gamma[i] − a) − ((x[i] − m)·s)·b), i < n.
TEXT ·lnDxOut(SB), NOSPLIT, $0-48
	MOVQ dx+0(FP), DI
	MOVQ dy+8(FP), SI
	MOVQ x+16(FP), R8
	MOVQ gamma+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ k+40(FP), AX
	VBROADCASTSS 0(AX), Z8
	VBROADCASTSS 4(AX), Z9
	VBROADCASTSS 8(AX), Z10
	VBROADCASTSS 12(AX), Z11
	TAILMASK(4, 15)
	XORQ BX, BX
	TESTQ R10, R10
	JZ xtail
xloop:
	VMOVUPS (SI)(BX*1), Z0
	VMULPS (R9)(BX*1), Z0, Z0
	VSUBPS Z10, Z0, Z0
	VMOVUPS (R8)(BX*1), Z1
	VSUBPS Z8, Z1, Z1
	VMULPS Z9, Z1, Z1
	VMULPS Z11, Z1, Z1
	VSUBPS Z1, Z0, Z0
	VMULPS Z9, Z0, Z0
	VMOVUPS Z0, (DI)(BX*1)
	ADDQ $64, BX
	DECQ R10
	JNZ xloop
xtail:
	TESTQ R11, R11
	JZ xdone
	VMOVUPS.Z (SI)(BX*1), K1, Z0
	VMOVUPS.Z (R9)(BX*1), K1, Z2
	VMULPS Z2, Z0, Z0
	VSUBPS Z10, Z0, Z0
	VMOVUPS.Z (R8)(BX*1), K1, Z1
	VSUBPS Z8, Z1, Z1
	VMULPS Z9, Z1, Z1
	VMULPS Z11, Z1, Z1
	VSUBPS Z1, Z0, Z0
	VMULPS Z9, Z0, Z0
	VMOVUPS Z0, K1, (DI)(BX*1)
xdone:
	VZEROUPPER
	RET

// func lnCols(gsum, bsum *float64, dy, x *float32, n int, m, s float32)
// gsum[i] += float64(dy[i])·float64((x[i] − m)·s); bsum[i] += float64(dy[i]), i < n.
TEXT ·lnCols(SB), NOSPLIT, $0-48
	MOVQ gsum+0(FP), DI
	MOVQ bsum+8(FP), R8
	MOVQ dy+16(FP), SI
	MOVQ x+24(FP), R9
	MOVQ n+32(FP), CX
	VBROADCASTSS m+40(FP), Y8
	VBROADCASTSS s+44(FP), Y9
	TAILMASK(3, 7)
	XORQ BX, BX                   // float32 index
	TESTQ R10, R10
	JZ ctail
cloop:
	VCVTPS2PD (SI)(BX*4), Z0
	VMOVUPS (R9)(BX*4), Y1
	VSUBPS Y8, Y1, Y1
	VMULPS Y9, Y1, Y1
	VCVTPS2PD Y1, Z1
	VMULPD Z1, Z0, Z1
	VADDPD (DI)(BX*8), Z1, Z1
	VMOVUPD Z1, (DI)(BX*8)
	VADDPD (R8)(BX*8), Z0, Z0
	VMOVUPD Z0, (R8)(BX*8)
	ADDQ $8, BX
	DECQ R10
	JNZ cloop
ctail:
	TESTQ R11, R11
	JZ cdone
	VMOVUPS.Z (SI)(BX*4), K1, Y0
	VCVTPS2PD Y0, Z0
	VMOVUPS.Z (R9)(BX*4), K1, Y1
	VSUBPS Y8, Y1, Y1
	VMULPS Y9, Y1, Y1
	VCVTPS2PD Y1, Z1
	VMULPD Z1, Z0, Z1
	VMOVUPD.Z (DI)(BX*8), K1, Z2
	VADDPD Z2, Z1, Z1
	VMOVUPD Z1, K1, (DI)(BX*8)
	VMOVUPD.Z (R8)(BX*8), K1, Z2
	VADDPD Z2, Z0, Z0
	VMOVUPD Z0, K1, (R8)(BX*8)
cdone:
	VZEROUPPER
	RET
