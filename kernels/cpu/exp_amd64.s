//go:build amd64 && !noasm

#include "textflag.h"

// exp(x − shift) of 8 float32 at a time, in float64, computed with the
// operations of Go's math.Exp on amd64 where the machine has FMA (Shibata's
// method: x reduced by k·ln 2 in two parts, scaled by 1/16, a degree-8
// polynomial, four squarings of 1 + x/2 + …, then 2^k), in the same order
// and fused the same way: math.Exp's results bit for bit. Lanes outside the
// plain range (x not finite, above the overflow bound, a result that is not
// a normal float64) stop the loop before their block is stored: the caller
// computes that block with math.Exp.

DATA expk<>+0(SB)/8, $1.4426950408889634073599246810018920   // log2(e)
DATA expk<>+8(SB)/8, $0.69314718055966295651160180568695068359375 // ln 2, upper part
DATA expk<>+16(SB)/8, $0.28235290563031577122588448175013436025525412068e-12 // ln 2, lower part
DATA expk<>+24(SB)/8, $0.0625
DATA expk<>+32(SB)/8, $2.4801587301587301587e-5 // 1/8!
DATA expk<>+40(SB)/8, $1.9841269841269841270e-4 // 1/7!
DATA expk<>+48(SB)/8, $1.3888888888888888889e-3 // 1/6!
DATA expk<>+56(SB)/8, $8.3333333333333333333e-3 // 1/5!
DATA expk<>+64(SB)/8, $4.1666666666666666667e-2 // 1/4!
DATA expk<>+72(SB)/8, $1.6666666666666666667e-1 // 1/3!
DATA expk<>+80(SB)/8, $0.5
DATA expk<>+88(SB)/8, $1.0
DATA expk<>+96(SB)/8, $2.0
DATA expk<>+104(SB)/8, $7.09782712893384e+02 // above it, +Inf
DATA expk<>+112(SB)/8, $0x7FFFFFFFFFFFFFFF // |x|
DATA expk<>+120(SB)/8, $0x7FF0000000000000 // +Inf
DATA expk<>+128(SB)/4, $1023
DATA expk<>+132(SB)/4, $1
DATA expk<>+136(SB)/4, $0x7FE
GLOBL expk<>(SB), RODATA|NOPTR, $144

// EXPSETUP broadcasts the constants and shift (in X0) into Z15–Z31 and
// Y12–Y14.
#define EXPSETUP \
	VBROADCASTSD X0, Z15 \
	VBROADCASTSD expk<>+0(SB), Z16 \
	VBROADCASTSD expk<>+8(SB), Z17 \
	VBROADCASTSD expk<>+16(SB), Z18 \
	VBROADCASTSD expk<>+24(SB), Z19 \
	VBROADCASTSD expk<>+32(SB), Z20 \
	VBROADCASTSD expk<>+40(SB), Z21 \
	VBROADCASTSD expk<>+48(SB), Z22 \
	VBROADCASTSD expk<>+56(SB), Z23 \
	VBROADCASTSD expk<>+64(SB), Z24 \
	VBROADCASTSD expk<>+72(SB), Z25 \
	VBROADCASTSD expk<>+80(SB), Z26 \
	VBROADCASTSD expk<>+88(SB), Z27 \
	VBROADCASTSD expk<>+96(SB), Z28 \
	VBROADCASTSD expk<>+104(SB), Z29 \
	VBROADCASTSD expk<>+112(SB), Z30 \
	VBROADCASTSD expk<>+120(SB), Z31 \
	VPBROADCASTD expk<>+128(SB), Y12 \
	VPBROADCASTD expk<>+132(SB), Y13 \
	VPBROADCASTD expk<>+136(SB), Y14

// EXP8 sets Z0 = exp(Z0) for 8 float64 lanes and K3 to the lanes outside
// the plain range. Clobbers Z1–Z5, K4, K5.
#define EXP8 \
	VPANDQ Z30, Z0, Z1 \
	VCMPPD $0x11, Z31, Z1, K3 \
	VCMPPD $0x1E, Z29, Z0, K4 \
	VMULPD Z16, Z0, Z1 \
	VCVTPD2DQ Z1, Y2 \
	VCVTDQ2PD Y2, Z1 \
	VFNMADD231PD Z17, Z1, Z0 \
	VFNMADD231PD Z18, Z1, Z0 \
	VMULPD Z19, Z0, Z0 \
	VMOVAPD Z20, Z3 \
	VFMADD213PD Z21, Z0, Z3 \
	VFMADD213PD Z22, Z0, Z3 \
	VFMADD213PD Z23, Z0, Z3 \
	VFMADD213PD Z24, Z0, Z3 \
	VFMADD213PD Z25, Z0, Z3 \
	VFMADD213PD Z26, Z0, Z3 \
	VFMADD213PD Z27, Z0, Z3 \
	VMULPD Z3, Z0, Z0 \
	VADDPD Z28, Z0, Z3 \
	VMULPD Z3, Z0, Z0 \
	VADDPD Z28, Z0, Z3 \
	VMULPD Z3, Z0, Z0 \
	VADDPD Z28, Z0, Z3 \
	VMULPD Z3, Z0, Z0 \
	VADDPD Z28, Z0, Z3 \
	VFMADD213PD Z27, Z3, Z0 \
	VPADDD Y12, Y2, Y2 \
	VPSUBD Y13, Y2, Y4 \
	VPCMPUD $5, Y14, Y4, K5 \
	VPMOVZXDQ Y2, Z5 \
	VPSLLQ $52, Z5, Z5 \
	VMULPD Z5, Z0, Z0 \
	KNOTB K3, K3 \
	KORB K4, K3, K3 \
	KORB K5, K3, K3

// func expShift(dst unsafe.Pointer, src *float32, n int, shift float64, wide bool) int
// exp(float64(src[i]) − shift) for i < n into dst: float64 where wide, else
// rounded to float32 (dst may then be src); returns how many it did: n, or
// where the first block it left begins.
TEXT ·expShift(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVSD shift+24(FP), X0
	MOVBQZX wide+32(FP), R10
	XORQ BX, BX                   // elements done
	TESTQ CX, CX
	JZ eret
	EXPSETUP
eloop:
	MOVQ CX, AX
	SUBQ BX, AX
	JZ edone
	CMPQ AX, $8
	JGE efull
	MOVQ AX, R8
	MOVQ CX, R9
	MOVQ R8, CX
	MOVQ $1, AX
	SHLQ CX, AX
	DECQ AX
	MOVQ R9, CX
	KMOVB AX, K1                  // the last elements, fewer than 8
	JMP eload
efull:
	KXNORB K1, K1, K1
eload:
	VMOVUPS.Z (SI)(BX*4), K1, Y0
	VCVTPS2PD Y0, Z0
	VSUBPD Z15, Z0, Z0
	EXP8
	KANDB K1, K3, K3
	KORTESTB K3, K3
	JNZ edone
	TESTQ R10, R10
	JNZ ewide
	VCVTPD2PS Z0, Y0
	VMOVUPS Y0, K1, (DI)(BX*4)
	JMP enext
ewide:
	VMOVUPD Z0, K1, (DI)(BX*8)
enext:
	ADDQ $8, BX
	CMPQ BX, CX
	JL eloop
	MOVQ CX, BX
edone:
	VZEROUPPER
eret:
	MOVQ BX, ret+40(FP)
	RET
