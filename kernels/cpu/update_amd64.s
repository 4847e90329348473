//go:build amd64 && !noasm

#include "textflag.h"
#include "tail_amd64.h"

// Float32 updates in AVX-512, each the Go loop's operations in the Go loop's
// order, none fused: the Go loop's results bit for bit.

// func adamwF32(param, grad, mom, vel *float32, n int, k *adamwK)
// k: w1, b2, 1-b2, decay, step, root, eps. For each i:
// m = m + w1·(g − m); v = b2·v + ((1−b2)·g)·g; p = p·decay;
// p = p − (step·m) / (√v / root + eps).
TEXT ·adamwF32(SB), NOSPLIT, $0-48
	MOVQ param+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ mom+16(FP), R8
	MOVQ vel+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ k+40(FP), AX
	TESTQ CX, CX
	JZ adone
	VBROADCASTSS 0(AX), Z16       // w1
	VBROADCASTSS 4(AX), Z17       // b2
	VBROADCASTSS 8(AX), Z18       // 1 − b2
	VBROADCASTSS 12(AX), Z19      // decay
	VBROADCASTSS 16(AX), Z20      // step
	VBROADCASTSS 20(AX), Z21      // root
	VBROADCASTSS 24(AX), Z22      // eps
	TAILMASK(4, 15)               // K1: the last elements, fewer than 16; R10: whole blocks of 16
	XORQ BX, BX
	TESTQ R10, R10
	JZ atail
aloop:
	VMOVUPS (SI)(BX*1), Z0        // g
	VMOVUPS (R8)(BX*1), Z1        // m
	VSUBPS Z1, Z0, Z2
	VMULPS Z2, Z16, Z2
	VADDPS Z2, Z1, Z1
	VMOVUPS Z1, (R8)(BX*1)
	VMOVUPS (R9)(BX*1), Z3        // v
	VMULPS Z3, Z17, Z3
	VMULPS Z0, Z18, Z4
	VMULPS Z0, Z4, Z4
	VADDPS Z4, Z3, Z3
	VMOVUPS Z3, (R9)(BX*1)
	VSQRTPS Z3, Z5
	VDIVPS Z21, Z5, Z5
	VADDPS Z22, Z5, Z5
	VMULPS Z1, Z20, Z6
	VDIVPS Z5, Z6, Z6
	VMOVUPS (DI)(BX*1), Z7
	VMULPS Z19, Z7, Z7
	VSUBPS Z6, Z7, Z7
	VMOVUPS Z7, (DI)(BX*1)
	ADDQ $64, BX
	DECQ R10
	JNZ aloop
atail:
	TESTQ R11, R11
	JZ azero
	VMOVUPS.Z (SI)(BX*1), K1, Z0
	VMOVUPS.Z (R8)(BX*1), K1, Z1
	VSUBPS Z1, Z0, Z2
	VMULPS Z2, Z16, Z2
	VADDPS Z2, Z1, Z1
	VMOVUPS Z1, K1, (R8)(BX*1)
	VMOVUPS.Z (R9)(BX*1), K1, Z3
	VMULPS Z3, Z17, Z3
	VMULPS Z0, Z18, Z4
	VMULPS Z0, Z4, Z4
	VADDPS Z4, Z3, Z3
	VMOVUPS Z3, K1, (R9)(BX*1)
	VSQRTPS Z3, Z5
	VDIVPS Z21, Z5, Z5
	VADDPS Z22, Z5, Z5
	VMULPS Z1, Z20, Z6
	VDIVPS Z5, Z6, Z6
	VMOVUPS.Z (DI)(BX*1), K1, Z7
	VMULPS Z19, Z7, Z7
	VSUBPS Z6, Z7, Z7
	VMOVUPS Z7, K1, (DI)(BX*1)
azero:
	VZEROUPPER
adone:
	RET

// func axpyF32(alpha float32, x, y *float32, n int)
// y[i] = y[i] + alpha·x[i] (the product rounded, then the sum).
TEXT ·axpyF32(SB), NOSPLIT, $0-32
	MOVQ x+8(FP), SI
	MOVQ y+16(FP), DI
	MOVQ n+24(FP), CX
	TESTQ CX, CX
	JZ xdone
	VBROADCASTSS alpha+0(FP), Z16
	TAILMASK(6, 15)               // R10: blocks of 64
	XORQ BX, BX
	TESTQ R10, R10
	JZ x16
xloop:
	VMULPS (SI)(BX*1), Z16, Z0
	VMULPS 64(SI)(BX*1), Z16, Z1
	VMULPS 128(SI)(BX*1), Z16, Z2
	VMULPS 192(SI)(BX*1), Z16, Z3
	VADDPS (DI)(BX*1), Z0, Z0
	VADDPS 64(DI)(BX*1), Z1, Z1
	VADDPS 128(DI)(BX*1), Z2, Z2
	VADDPS 192(DI)(BX*1), Z3, Z3
	VMOVUPS Z0, (DI)(BX*1)
	VMOVUPS Z1, 64(DI)(BX*1)
	VMOVUPS Z2, 128(DI)(BX*1)
	VMOVUPS Z3, 192(DI)(BX*1)
	ADDQ $256, BX
	DECQ R10
	JNZ xloop
x16:
	MOVQ n+24(FP), R10
	ANDQ $63, R10
	SHRQ $4, R10                  // blocks of 16 left
	TESTQ R10, R10
	JZ xtail
x16loop:
	VMULPS (SI)(BX*1), Z16, Z0
	VADDPS (DI)(BX*1), Z0, Z0
	VMOVUPS Z0, (DI)(BX*1)
	ADDQ $64, BX
	DECQ R10
	JNZ x16loop
xtail:
	TESTQ R11, R11
	JZ xzero
	VMOVUPS.Z (SI)(BX*1), K1, Z0
	VMULPS Z0, Z16, Z0
	VMOVUPS.Z (DI)(BX*1), K1, Z1
	VADDPS Z1, Z0, Z0
	VMOVUPS Z0, K1, (DI)(BX*1)
xzero:
	VZEROUPPER
xdone:
	RET
