//go:build amd64 && !noasm

#include "textflag.h"

// Constants of the float32 GELU (see gelu.go), one per 4 bytes.
DATA geluConst<>+0(SB)/4, $0.7978845608028654   // √(2/π)
DATA geluConst<>+4(SB)/4, $0.044715             // the cubic coefficient
DATA geluConst<>+8(SB)/4, $0x7fffffff           // |·| mask
DATA geluConst<>+12(SB)/4, $9.0                 // tanh saturates in float32
DATA geluConst<>+16(SB)/4, $2.0
DATA geluConst<>+20(SB)/4, $1.4426950408889634  // log2(e)
DATA geluConst<>+24(SB)/4, $0.693145751953125   // ln 2, high bits
DATA geluConst<>+28(SB)/4, $1.4286068203094173e-06 // ln 2, low bits
DATA geluConst<>+32(SB)/4, $0.001388888888888889 // 1/720
DATA geluConst<>+36(SB)/4, $0.008333333333333333 // 1/120
DATA geluConst<>+40(SB)/4, $0.041666666666666664 // 1/24
DATA geluConst<>+44(SB)/4, $0.16666666666666666 // 1/6
DATA geluConst<>+48(SB)/4, $0.5
DATA geluConst<>+52(SB)/4, $1.0
DATA geluConst<>+56(SB)/4, $0x80000000          // sign mask
DATA geluConst<>+60(SB)/4, $0.134145            // 3 × 0.044715
GLOBL geluConst<>(SB), RODATA|NOPTR, $64

// LOADCONSTS broadcasts the constants into Z16..Z31.
#define LOADCONSTS \
	VBROADCASTSS geluConst<>+0(SB), Z16  \
	VBROADCASTSS geluConst<>+4(SB), Z17  \
	VBROADCASTSS geluConst<>+8(SB), Z18  \
	VBROADCASTSS geluConst<>+12(SB), Z19 \
	VBROADCASTSS geluConst<>+16(SB), Z20 \
	VBROADCASTSS geluConst<>+20(SB), Z21 \
	VBROADCASTSS geluConst<>+24(SB), Z22 \
	VBROADCASTSS geluConst<>+28(SB), Z23 \
	VBROADCASTSS geluConst<>+32(SB), Z24 \
	VBROADCASTSS geluConst<>+36(SB), Z25 \
	VBROADCASTSS geluConst<>+40(SB), Z26 \
	VBROADCASTSS geluConst<>+44(SB), Z27 \
	VBROADCASTSS geluConst<>+48(SB), Z28 \
	VBROADCASTSS geluConst<>+52(SB), Z29 \
	VBROADCASTSS geluConst<>+56(SB), Z30 \
	VBROADCASTSS geluConst<>+60(SB), Z31

// TANH computes, from x in Z0, t = tanh(√(2/π)(x + 0.044715x³)) in Z6.
// Uses Z1..Z7.
#define TANH \
	VMULPS Z0, Z0, Z1          \ // x²
	VMULPS Z17, Z1, Z1         \ // k·x²
	VFMADD213PS Z0, Z0, Z1     \ // x + k·x³
	VMULPS Z16, Z1, Z1         \ // u
	VANDPS Z18, Z1, Z2         \ // |u|
	VMINPS Z19, Z2, Z2         \
	VADDPS Z2, Z2, Z2          \ // z = 2|u|
	VMULPS Z21, Z2, Z3         \
	VRNDSCALEPS $0, Z3, Z3     \ // k = round(z·log2 e)
	VMOVAPS Z2, Z4             \
	VFNMADD231PS Z22, Z3, Z4   \ // r = z - k·ln2
	VFNMADD231PS Z23, Z3, Z4   \
	VMOVAPS Z24, Z5            \ // e^r, Horner
	VFMADD213PS Z25, Z4, Z5    \
	VFMADD213PS Z26, Z4, Z5    \
	VFMADD213PS Z27, Z4, Z5    \
	VFMADD213PS Z28, Z4, Z5    \
	VFMADD213PS Z29, Z4, Z5    \
	VFMADD213PS Z29, Z4, Z5    \
	VSCALEFPS Z3, Z5, Z5       \ // e^z = e^r·2^k
	VADDPS Z29, Z5, Z5         \
	VDIVPS Z5, Z20, Z6         \ // 2/(e^z+1)
	VSUBPS Z6, Z29, Z6         \ // tanh|u|
	VANDPS Z30, Z1, Z7         \
	VORPS Z7, Z6, Z6             // sign of u

// func geluForwardAVX512(y, x *float32, n int)
// y[i] = 0.5·x·(1 + t) for i < n, n a multiple of 16.
TEXT ·geluForwardAVX512(SB), NOSPLIT, $0-24
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ fdone
	LOADCONSTS
floop:
	VMOVUPS (SI), Z0
	TANH
	VADDPS Z29, Z6, Z8
	VMULPS Z0, Z8, Z8
	VMULPS Z28, Z8, Z8
	VMOVUPS Z8, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ floop
	VZEROUPPER
fdone:
	RET

// func geluBackwardAVX512(dx, dy, x *float32, n int)
// dx[i] = dy·(0.5(1+t) + 0.5·x·(1-t²)·√(2/π)(1+3·0.044715x²)), n a multiple of 16.
TEXT ·geluBackwardAVX512(SB), NOSPLIT, $0-32
	MOVQ dx+0(FP), DI
	MOVQ dy+8(FP), DX
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	JZ bdone
	LOADCONSTS
bloop:
	VMOVUPS (SI), Z0
	TANH
	VADDPS Z29, Z6, Z8         // 1 + t
	VMULPS Z28, Z8, Z8         // a = 0.5(1+t)
	VMOVAPS Z29, Z9
	VFNMADD231PS Z6, Z6, Z9    // 1 - t²
	VMULPS Z0, Z0, Z10
	VFMADD213PS Z29, Z31, Z10  // 1 + 3k·x²
	VMULPS Z16, Z10, Z10
	VMULPS Z0, Z10, Z10
	VMULPS Z28, Z10, Z10
	VMULPS Z9, Z10, Z10
	VADDPS Z10, Z8, Z8
	VMULPS (DX), Z8, Z8
	VMOVUPS Z8, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	DECQ CX
	JNZ bloop
	VZEROUPPER
bdone:
	RET
