//go:build amd64 && !purego

#include "textflag.h"

// func addF32(dst, src *float32, n int)
// dst[i] += src[i] for i < n; n is a multiple of 8.
TEXT ·addF32(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
loop32:
	CMPQ CX, $32
	JLT  loop8
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VADDPS  (DI), Y0, Y0
	VADDPS  32(DI), Y1, Y1
	VADDPS  64(DI), Y2, Y2
	VADDPS  96(DI), Y3, Y3
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $32, CX
	JMP  loop32
loop8:
	CMPQ CX, $8
	JLT  done
	VMOVUPS (SI), Y0
	VADDPS  (DI), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  loop8
done:
	VZEROUPPER
	RET

// func addF64(dst, src *float64, n int)
// dst[i] += src[i] for i < n; n is a multiple of 4.
TEXT ·addF64(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
loop16:
	CMPQ CX, $16
	JLT  loop4
	VMOVUPD (SI), Y0
	VMOVUPD 32(SI), Y1
	VMOVUPD 64(SI), Y2
	VMOVUPD 96(SI), Y3
	VADDPD  (DI), Y0, Y0
	VADDPD  32(DI), Y1, Y1
	VADDPD  64(DI), Y2, Y2
	VADDPD  96(DI), Y3, Y3
	VMOVUPD Y0, (DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $16, CX
	JMP  loop16
loop4:
	CMPQ CX, $4
	JLT  done64
	VMOVUPD (SI), Y0
	VADDPD  (DI), Y0, Y0
	VMOVUPD Y0, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $4, CX
	JMP  loop4
done64:
	VZEROUPPER
	RET

// func maxF32(dst, src *float32, n int)
// dst[i] = max(dst[i], src[i]), NaN if either is NaN; n is a multiple of 8.
TEXT ·maxF32(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
maxloop:
	CMPQ CX, $8
	JLT  maxdone
	VMOVUPS (DI), Y0            // d
	VMOVUPS (SI), Y1            // s
	VMAXPS  Y1, Y0, Y2          // d > s ? d : s (s when either is NaN)
	VCMPPS  $3, Y0, Y0, Y3      // d is NaN
	VBLENDVPS Y3, Y0, Y2, Y2    // NaN d wins
	VMOVUPS Y2, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  maxloop
maxdone:
	VZEROUPPER
	RET

// func minF32(dst, src *float32, n int)
// dst[i] = min(dst[i], src[i]), NaN if either is NaN; n is a multiple of 8.
TEXT ·minF32(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
minloop:
	CMPQ CX, $8
	JLT  mindone
	VMOVUPS (DI), Y0
	VMOVUPS (SI), Y1
	VMINPS  Y1, Y0, Y2
	VCMPPS  $3, Y0, Y0, Y3
	VBLENDVPS Y3, Y0, Y2, Y2
	VMOVUPS Y2, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  minloop
mindone:
	VZEROUPPER
	RET
