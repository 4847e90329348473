package main

import (
	"bytes"
	"fmt"
	"strings"
)

// bfloat16 kernels. Go's assembler does not know the AVX512_BF16 instructions
// (VDPBF16PS, VCVTNE2PS2BF16, VCVTNEPS2BF16), so they are emitted as EVEX
// bytes (evex512).

// evex512 encodes the register form of an EVEX.512.pp.0F38.W0 instruction
// `opcode /r` with zmm operands: dst in ModRM.reg, src1 in EVEX.vvvv (V'),
// src2 in ModRM.rm (B, X). pp: 1 = 66, 2 = F3, 3 = F2. No masking.
//
//	62 | R X B R' 0 0 1 0 | W vvvv 1 pp | z L'L b V' aaa | opcode | 11 reg rm
//
// with R, X, B, R', vvvv and V' stored inverted (Intel SDM vol. 2, 2.7.1).
func evex512(pp, opcode byte, dst, src1, src2 int) []byte {
	bit := func(v, i int) byte { return byte(v>>i) & 1 }
	p0 := (1-bit(dst, 3))<<7 | (1-bit(src2, 4))<<6 | (1-bit(src2, 3))<<5 | (1-bit(dst, 4))<<4 | 0b10
	p1 := byte(^src1&15)<<3 | 1<<2 | pp
	p2 := byte(0b10)<<5 | (1-bit(src1, 4))<<3
	modrm := byte(0xC0) | byte(dst&7)<<3 | byte(src2&7)
	return []byte{0x62, p0, p1, p2, opcode, modrm}
}

// vdpbf16ps returns VDPBF16PS Zdst, Zsrc1, Zsrc2 (EVEX.512.F3.0F38.W0 52 /r):
// for each of 16 lanes, dst.fp32 += src1.bf16[2i+1]·src2.bf16[2i+1] +
// src1.bf16[2i]·src2.bf16[2i], as one line of BYTE directives.
func vdpbf16ps(dst, src1, src2 int) string {
	return byteLine(evex512(2, 0x52, dst, src1, src2), fmt.Sprintf("VDPBF16PS Z%d, Z%d, Z%d", dst, src1, src2))
}

// vcvtne2ps2bf16 returns VCVTNE2PS2BF16 Zdst, Zsrc1, Zsrc2 (EVEX.512.F2.0F38.W0
// 72 /r): the low 16 words from src2, the high 16 from src1, rounded to
// nearest even.
func vcvtne2ps2bf16(dst, src1, src2 int) string {
	return byteLine(evex512(3, 0x72, dst, src1, src2), fmt.Sprintf("VCVTNE2PS2BF16 Z%d, Z%d, Z%d", dst, src1, src2))
}

// vcvtneps2bf16 returns VCVTNEPS2BF16 Ydst, Zsrc (EVEX.512.F3.0F38.W0 72 /r,
// vvvv unused): 16 floats to 16 bfloat16, rounded to nearest even.
func vcvtneps2bf16(dst, src int) string {
	return byteLine(evex512(2, 0x72, dst, 0, src), fmt.Sprintf("VCVTNEPS2BF16 Y%d, Z%d", dst, src))
}

func byteLine(b []byte, comment string) string {
	parts := make([]string, len(b))
	for i, x := range b {
		parts[i] = fmt.Sprintf("BYTE $0x%02x", x)
	}
	return strings.Join(parts, "; ") + " // " + comment
}

// kernBF16 is a VDPBF16PS micro-kernel:
//
//	func name(depth int, a, b *float32, mr int, mask uint64, e *epi16)
//
// a is an A panel of MR lanes per k pair, b a B panel of NR = 16·NV lanes per
// k pair (each lane a bfloat16 pair (k, k+1)); acc[i][j] = Σ over depth pairs.
// The output stage is epi16's (kernels/cpu/bf16.go): v = alpha·acc (+ bias[j])
// (+ beta·in[i][j]) stored as float32 or rounded to bfloat16 (to nearest even,
// NaN kept quiet, as tensor.ToBF16), for rows < mr and the columns in mask.
type kernBF16 struct {
	name   string
	mr, nv int
}

// bf16Kernels are the packed VDPBF16PS micro-kernels. (A 12x32 tile measured
// 1-2% faster on cache-resident panels but not in the loop nest, and 2-6%
// slower on weight gradients: 8x48 only.)
var bf16Kernels = []kernBF16{
	{"bgemmDP8x48", 8, 3},
}

func genBF16(w *bytes.Buffer, k kernBF16) {
	p := func(format string, args ...any) { fmt.Fprintf(w, "\t"+format+"\n", args...) }
	label := func(l string) { fmt.Fprintf(w, "%s_%s:\n", k.name, l) }
	nacc := k.mr * k.nv
	nr := 16 * k.nv
	acc := func(i, v int) int { return i*k.nv + v }
	breg := func(v int) int { return nacc + v }
	bc := [2]int{nacc + k.nv, nacc + k.nv + 1}
	if nacc+k.nv+2 > 32 {
		panic(k.name + ": too many registers")
	}
	fmt.Fprintf(w, "\n// func %s(depth int, a, b *float32, mr int, mask uint64, e *epi16)\n", k.name)
	fmt.Fprintf(w, "// %dx%d tile of bfloat16 pairs, VDPBF16PS.\n", k.mr, nr)
	fmt.Fprintf(w, "TEXT ·%s(SB), NOSPLIT, $0-48\n", k.name)
	p("MOVQ depth+0(FP), CX")
	p("MOVQ a+8(FP), AX")
	p("MOVQ b+16(FP), BX")
	p("MOVQ e+40(FP), DI")
	// Prefetch the output rows: bytes 0, 64, last-64 and last of each row
	// (last = NR·4-1 for float32, NR·2-1 for bfloat16): every line they span;
	// and the rows of the beta term when they are elsewhere (the float32 sums
	// of earlier K blocks).
	// (The k loop keeps its counts in R11 and R13: prefetches use R8-R10, R12, SI.)
	p("MOVQ epi16_flags(DI), R8")
	lastByte := func(flag string) {
		p("MOVQ $%d, R12", nr*4-1)
		p("MOVQ $%d, R9", nr*2-1)
		p("TESTQ $%s, R8", flag)
		p("CMOVQNE R9, R12")
	}
	rowsPF := func(instr, ptr, ld string) {
		p("MOVQ epi16_%s(DI), R10", ptr)
		p("MOVQ epi16_%s(DI), SI", ld)
		for i := 0; i < k.mr; i++ {
			p("%s (R10)", instr)
			p("%s 64(R10)", instr)
			p("%s -64(R10)(R12*1)", instr)
			p("%s (R10)(R12*1)", instr)
			if i < k.mr-1 {
				p("ADDQ SI, R10")
			}
		}
	}
	pfCount := 0
	prefetchOut := func(instr string) {
		pfCount++
		lastByte("const_epiOutBF16")
		rowsPF(instr, "out", "ldOut")
		// The beta term's rows, when read and not the output's.
		p("MOVL epi16_beta(DI), R9")
		p("ANDL $0x7fffffff, R9")
		p("JZ %s_nopfin%d", k.name, pfCount)
		p("MOVQ epi16_in(DI), R10")
		p("CMPQ R10, epi16_out(DI)")
		p("JEQ %s_nopfin%d", k.name, pfCount)
		lastByte("const_epiInBF16")
		rowsPF(instr, "in", "ldIn")
		label(fmt.Sprintf("nopfin%d", pfCount))
	}
	// Early (into L2) only when the k loop is long enough for it to matter.
	p("CMPQ CX, $%d", 4*8+4)
	p("JLT %s_nopf1", k.name)
	prefetchOut("PREFETCHT1")
	label("nopf1")
	for i := 0; i < nacc; i++ {
		p("VPXORD Z%d, Z%d, Z%d", i, i, i)
	}
	const unroll = 4
	step := func(u int) {
		for v := 0; v < k.nv; v++ {
			p("VMOVUPS %d(BX), Z%d", (u*nr+16*v)*4, breg(v))
		}
		for i := 0; i < k.mr; i++ {
			r := bc[i%2]
			p("VBROADCASTSS %d(AX), Z%d", (u*k.mr+i)*4, r)
			for v := 0; v < k.nv; v++ {
				p("%s", vdpbf16ps(acc(i, v), breg(v), r))
			}
		}
	}
	// Two legs, as the float32 kernels: the output is prefetched again near
	// the end of the k loop, late enough to be in L1 for the store.
	const late = 8
	p("MOVQ CX, R11")
	p("SHRQ $2, R11")
	p("MOVQ $%d, R13", late)
	p("CMPQ R11, R13")
	p("CMOVQLT R11, R13")
	p("SUBQ R13, R11")
	p("JZ %s_leg2", k.name)
	label("loop4")
	p("PREFETCHT0 %d(AX)", 8*k.mr*4)
	for u := 0; u < unroll; u++ {
		step(u)
	}
	p("ADDQ $%d, AX", unroll*k.mr*4)
	p("ADDQ $%d, BX", unroll*nr*4)
	p("DECQ R11")
	p("JNZ %s_loop4", k.name)
	label("leg2")
	prefetchOut("PREFETCHT0")
	p("MOVQ R13, R11")
	p("TESTQ R11, R11")
	p("JZ %s_tail", k.name)
	label("loop4b")
	for u := 0; u < unroll; u++ {
		step(u)
	}
	p("ADDQ $%d, AX", unroll*k.mr*4)
	p("ADDQ $%d, BX", unroll*nr*4)
	p("DECQ R11")
	p("JNZ %s_loop4b", k.name)
	label("tail")
	p("ANDQ $3, CX")
	p("JZ %s_store", k.name)
	label("loop1")
	step(0)
	p("ADDQ $%d, AX", k.mr*4)
	p("ADDQ $%d, BX", nr*4)
	p("DECQ CX")
	p("JNZ %s_loop1", k.name)

	label("store")
	genStore16(w, k.name, k.mr, k.nv, acc, true)
}

// genStore16 writes the output stage of epi16 for an mr×(16·nv) tile held in
// registers acc(i, v), e in DI, mask in mask+32(FP), rows in mr+24(FP). It
// uses Z24..Z31 and K1..K4, and ends with RET. With hw, bfloat16 results are
// rounded by VCVTNE2PS2BF16/VCVTNEPS2BF16 (AVX512_BF16: to nearest even, NaN
// quieted as tensor.ToBF16, but denormals flushed to zero, as VDPBF16PS
// itself does); otherwise in integer arithmetic, exactly tensor.ToBF16.
func genStore16(w *bytes.Buffer, name string, mr, nv int, acc func(i, v int) int, hw bool) {
	p := func(format string, args ...any) { fmt.Fprintf(w, "\t"+format+"\n", args...) }
	label := func(l string) { fmt.Fprintf(w, "%s_%s:\n", name, l) }
	const alpha, beta, one, rbias, quiet, tmp, tmp2 = 24, 25, 26, 27, 28, 30, 31
	p("VBROADCASTSS epi16_alpha(DI), Z%d", alpha)
	for i := 0; i < mr; i++ {
		for v := 0; v < nv; v++ {
			p("VMULPS Z%d, Z%d, Z%d", alpha, acc(i, v), acc(i, v))
		}
	}
	p("MOVQ mask+32(FP), R9")
	p("KMOVQ R9, K1")
	for v := 1; v < nv; v++ {
		p("KSHIFTRQ $%d, K1, K%d", 16*v, v+1)
	}
	p("MOVQ mr+24(FP), R8")
	p("MOVQ epi16_flags(DI), R11")
	// Bias: one row (masked), added to every row.
	p("MOVQ epi16_bias(DI), R10")
	p("TESTQ R10, R10")
	p("JZ %s_nobias", name)
	p("TESTQ $const_epiBiasBF16, R11")
	p("JNZ %s_biasbf", name)
	for v := 0; v < nv; v++ {
		p("VMOVUPS.Z %d(R10), K%d, Z%d", 64*v, v+1, 29+v-(nv-3))
	}
	p("JMP %s_biasadd", name)
	label("biasbf")
	for v := 0; v < nv; v++ {
		r := 29 + v - (nv - 3)
		p("VPMOVZXWD.Z %d(R10), K%d, Z%d", 32*v, v+1, r)
		p("VPSLLD $16, Z%d, Z%d", r, r)
	}
	label("biasadd")
	for i := 0; i < mr; i++ {
		for v := 0; v < nv; v++ {
			r := 29 + v - (nv - 3)
			p("VADDPS Z%d, Z%d, Z%d", r, acc(i, v), acc(i, v))
		}
	}
	label("nobias")
	// Rounding constants: 1, 0x7fff, the quiet bit 0x40.
	p("MOVL $1, R13")
	p("VPBROADCASTD R13, Z%d", one)
	p("MOVL $0x7fff, R13")
	p("VPBROADCASTD R13, Z%d", rbias)
	p("MOVL $0x40, R13")
	p("VPBROADCASTD R13, Z%d", quiet)
	p("MOVQ epi16_out(DI), R9")
	p("MOVQ epi16_ldOut(DI), DX")
	// The beta term is read only when beta != 0 (either sign).
	p("MOVL epi16_beta(DI), R12")
	p("ANDL $0x7fffffff, R12")
	p("JZ %s_in0", name)
	p("VBROADCASTSS epi16_beta(DI), Z%d", beta)
	p("MOVQ epi16_in(DI), R10")
	p("MOVQ epi16_ldIn(DI), R12")
	p("TESTQ $const_epiInBF16, R11")
	p("JNZ %s_in2", name)
	p("JMP %s_in1", name)
	for in := 0; in < 3; in++ {
		label(fmt.Sprintf("in%d", in))
		p("TESTQ $const_epiOutBF16, R11")
		p("JNZ %s_s%d1", name, in)
		for out := 0; out < 2; out++ {
			if out == 1 {
				label(fmt.Sprintf("s%d1", in))
			}
			for i := 0; i < mr; i++ {
				for v := 0; v < nv; v++ {
					a := acc(i, v)
					switch in {
					case 1:
						p("VMOVUPS.Z %d(R10), K%d, Z%d", 64*v, v+1, tmp)
						p("VFMADD231PS Z%d, Z%d, Z%d", beta, tmp, a)
					case 2:
						p("VPMOVZXWD.Z %d(R10), K%d, Z%d", 32*v, v+1, tmp)
						p("VPSLLD $16, Z%d, Z%d", tmp, tmp)
						p("VFMADD231PS Z%d, Z%d, Z%d", beta, tmp, a)
					}
					if out == 0 {
						p("VMOVUPS Z%d, K%d, %d(R9)", a, v+1, 64*v)
						continue
					}
					if hw {
						continue // converted by pairs below
					}
					// Round to nearest even: (u + 0x7fff + (u>>16 & 1)) >> 16;
					// NaN: u>>16 | 0x40.
					p("VPSRLD $16, Z%d, Z%d", a, tmp2)
					p("VPANDD Z%d, Z%d, Z%d", one, tmp2, tmp2)
					p("VPADDD Z%d, Z%d, Z%d", rbias, tmp2, tmp2)
					p("VPADDD Z%d, Z%d, Z%d", a, tmp2, tmp2)
					p("VPSRLD $16, Z%d, Z%d", tmp2, tmp2)
					p("VCMPPS $3, Z%d, Z%d, K4", a, a)
					p("VPSRLD $16, Z%d, K4, Z%d", a, tmp2)
					p("VPORD Z%d, Z%d, K4, Z%d", quiet, tmp2, tmp2)
					p("VPMOVDW Z%d, K%d, %d(R9)", tmp2, v+1, 32*v)
				}
				if out == 1 && hw {
					// VCVTNE2PS2BF16: two vectors into 32 words (columns
					// 32v..32v+31, mask bits of K(v+1) for 32 columns: K1
					// holds all of them from bit 0, K3 those from 32).
					for v := 0; v < nv; v += 2 {
						if v+1 < nv {
							p("%s", vcvtne2ps2bf16(tmp2, acc(i, v+1), acc(i, v)))
							p("VMOVDQU16 Z%d, K%d, %d(R9)", tmp2, v+1, 32*v)
						} else {
							p("%s", vcvtneps2bf16(tmp2, acc(i, v)))
							p("VMOVDQU16 Y%d, K%d, %d(R9)", tmp2, v+1, 32*v)
						}
					}
				}
				if i == mr-1 {
					break
				}
				p("ADDQ DX, R9")
				if in > 0 {
					p("ADDQ R12, R10")
				}
				p("DECQ R8")
				p("JZ %s_done", name)
			}
			p("JMP %s_done", name)
		}
	}
	label("done")
	p("VZEROUPPER")
	p("RET")
}

// kernDot is a small-M dot kernel:
//
//	func name(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)
//
// out[i*ldo+j] = Σ_{k<n} x_i[k]·w[j*ldw+k] for i < R, j < C, where xp holds
// the R rows of x packed by steps: for each step of E elements, R rows of E
// values (64 bytes each, zero past n). w rows are read in place (the tail
// masked). dp: VDPBF16PS on 32 bfloat16 per step (x packed as bfloat16);
// otherwise w is widened (16 per step) and multiplied with FMAs (x packed as
// float32).
type kernDot struct {
	name string
	r, c int
	dp   bool
}

var dotKernels = func() []kernDot {
	var ks []kernDot
	for _, dp := range []bool{true, false} {
		for _, rc := range [][2]int{{4, 6}, {4, 1}, {2, 6}, {2, 1}, {1, 6}, {1, 1}} {
			pfx := "bdotDP"
			if !dp {
				pfx = "bdotW"
			}
			ks = append(ks, kernDot{fmt.Sprintf("%s%dx%d", pfx, rc[0], rc[1]), rc[0], rc[1], dp})
		}
	}
	return ks
}()

// dotPF is how far ahead (bytes) the dot kernels prefetch their w rows.
var dotPF = 4096

func genDot(w *bytes.Buffer, k kernDot) {
	p := func(format string, args ...any) { fmt.Fprintf(w, "\t"+format+"\n", args...) }
	label := func(l string) { fmt.Fprintf(w, "%s_%s:\n", k.name, l) }
	// Registers: acc i*C+j, x rows after the accumulators, two w registers.
	nacc := k.r * k.c
	xreg := func(i int) int { return nacc + i }
	wreg := [2]int{nacc + k.r, nacc + k.r + 1}
	if nacc+k.r+2 > 30 || k.c > 6 {
		panic(k.name + ": too many registers")
	}
	rows := []string{"DI", "R8", "R9", "R10", "R11", "R12"}
	e := 16 // elements per step
	if k.dp {
		e = 32
	}
	fmt.Fprintf(w, "\n// func %s(n int, xp *bf16, w *bf16, ldw int, out *float32, ldo int)\n", k.name)
	fmt.Fprintf(w, "TEXT ·%s(SB), NOSPLIT, $0-48\n", k.name)
	p("MOVQ n+0(FP), CX")
	p("MOVQ xp+8(FP), SI")
	p("MOVQ w+16(FP), DI")
	p("MOVQ ldw+24(FP), DX")
	p("SHLQ $1, DX")
	for j := 1; j < k.c; j++ {
		p("LEAQ (%s)(DX*1), %s", rows[j-1], rows[j])
	}
	for i := 0; i < nacc; i++ {
		p("VPXORD Z%d, Z%d, Z%d", i, i, i)
	}
	p("XORQ AX, AX") // byte offset along the w rows
	p("MOVQ CX, BX")
	p("SHRQ $%d, BX", log2(e))
	p("JZ %s_tail", k.name)
	body := func(masked bool) {
		for i := 0; i < k.r; i++ {
			if k.dp {
				p("VMOVDQU16 %d(SI), Z%d", 64*i, xreg(i))
			} else {
				p("VMOVUPS %d(SI), Z%d", 64*i, xreg(i))
			}
		}
		for j := 0; j < k.c; j++ {
			wr := wreg[j%2]
			z := ""
			mk := ""
			if masked {
				z, mk = ".Z", "K1, "
			}
			if k.dp {
				p("VMOVDQU16%s (%s)(AX*1), %sZ%d", z, rows[j], mk, wr)
			} else {
				p("VPMOVZXWD%s (%s)(AX*1), %sZ%d", z, rows[j], mk, wr)
				p("VPSLLD $16, Z%d, Z%d", wr, wr)
			}
			for i := 0; i < k.r; i++ {
				if k.dp {
					p("%s", vdpbf16ps(i*k.c+j, wr, xreg(i)))
				} else {
					p("VFMADD231PS Z%d, Z%d, Z%d", wr, xreg(i), i*k.c+j)
				}
			}
		}
		p("ADDQ $%d, SI", 64*k.r)
		p("ADDQ $%d, AX", 2*e)
	}
	label("loop")
	// With few w rows in flight (the kernels for many x rows), prefetch each
	// dotPF bytes ahead: rows are short (a few KB) streams that the hardware
	// prefetcher alone picks up late. (With one x row, six streams keep memory
	// busy and prefetches only add traffic: measured slower.)
	if k.r >= 4 {
		for j := 0; j < k.c; j++ {
			p("PREFETCHT0 %d(%s)(AX*1)", dotPF, rows[j])
		}
	}
	body(false)
	p("DECQ BX")
	p("JNZ %s_loop", k.name)
	label("tail")
	p("ANDQ $%d, CX", e-1)
	p("JZ %s_reduce", k.name)
	p("MOVQ $1, BX")
	p("SHLQ CX, BX")
	p("DECQ BX")
	p("KMOVQ BX, K1")
	body(true)
	label("reduce")
	p("MOVQ out+32(FP), BX")
	p("MOVQ ldo+40(FP), DX")
	p("SHLQ $2, DX")
	for i := 0; i < k.r; i++ {
		for j := 0; j < k.c; j++ {
			a := i*k.c + j
			p("VEXTRACTF64X4 $1, Z%d, Y30", a)
			p("VADDPS Y30, Y%d, Y%d", a, a)
			p("VEXTRACTF32X4 $1, Y%d, X30", a)
			p("VADDPS X30, X%d, X%d", a, a)
			p("VPERMILPS $0x4E, X%d, X30", a)
			p("VADDPS X30, X%d, X%d", a, a)
			p("VPERMILPS $0xB1, X%d, X30", a)
			p("VADDPS X30, X%d, X%d", a, a)
			p("VMOVSS X%d, %d(BX)", a, 4*j)
		}
		if i < k.r-1 {
			p("ADDQ DX, BX")
		}
	}
	p("VZEROUPPER")
	p("RET")
}

// genDirect writes the small-M VDPBF16PS kernel that reads an untransposed B
// in place (no packing):
//
//	func name(depth int, a *float32, b *bf16, mr int, mask uint64, e *epi16, ldb int, odd int)
//
// a is a packed 8-row A panel of bfloat16 pairs (depth+odd pairs), b points at
// row 0 of the 32 columns of the tile (rows ldb elements apart; columns past
// mask are not read). Each pair of rows of b is interleaved into pairs with
// VPUNPCKLWD/VPUNPCKHWD, which order the columns by 128-bit lanes: the lo
// accumulator holds columns 0-3, 8-11, 16-19, 24-27, the hi one 4-7, 12-15,
// 20-23, 28-31; two VPERMT2PS restore the order before the output stage. With
// odd = 1 a last row of b pairs with zeros.
func genDirect(w *bytes.Buffer, name string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, "\t"+format+"\n", args...) }
	label := func(l string) { fmt.Fprintf(w, "%s_%s:\n", name, l) }
	const mr, nv = 8, 2
	acc := func(i, v int) int { return i*nv + v }
	const blo, bhi, r0, r1, bc0, bc1, idx0, idx1 = 16, 17, 18, 19, 20, 21, 22, 23
	fmt.Fprintf(w, "\n// func %s(depth int, a *float32, b *bf16, mr int, mask uint64, e *epi16, ldb int, odd int)\n", name)
	fmt.Fprintf(w, "TEXT ·%s(SB), NOSPLIT, $0-64\n", name)
	p("MOVQ depth+0(FP), CX")
	p("MOVQ a+8(FP), AX")
	p("MOVQ b+16(FP), BX")
	p("MOVQ e+40(FP), DI")
	p("MOVQ ldb+48(FP), DX")
	p("SHLQ $1, DX")
	p("MOVQ mask+32(FP), R9")
	p("KMOVQ R9, K5")
	// The output rows into L2 (64 bytes of bfloat16 or 128 of float32 each).
	p("MOVQ epi16_out(DI), R10")
	p("MOVQ epi16_ldOut(DI), SI")
	for i := 0; i < mr; i++ {
		p("PREFETCHT1 (R10)")
		p("PREFETCHT1 64(R10)")
		p("PREFETCHT1 127(R10)")
		if i < mr-1 {
			p("ADDQ SI, R10")
		}
	}
	for i := 0; i < mr*nv; i++ {
		p("VPXORD Z%d, Z%d, Z%d", i, i, i)
	}
	step := func(aoff int, zeroHi bool) {
		p("VMOVDQU16.Z (BX), K5, Z%d", r0)
		if zeroHi {
			p("VPXORD Z%d, Z%d, Z%d", r1, r1, r1)
		} else {
			p("VMOVDQU16.Z (BX)(DX*1), K5, Z%d", r1)
			// The same rows two tiles to the right: the loop nest walks a
			// block of rows tile after tile, so each row is a stream.
			p("PREFETCHT0 128(BX)")
			p("PREFETCHT0 128(BX)(DX*1)")
		}
		p("VPUNPCKLWD Z%d, Z%d, Z%d", r1, r0, blo)
		p("VPUNPCKHWD Z%d, Z%d, Z%d", r1, r0, bhi)
		for i := 0; i < mr; i++ {
			r := bc0 + i%2
			p("VBROADCASTSS %d(AX), Z%d", aoff+4*i, r)
			p("%s", vdpbf16ps(acc(i, 0), blo, r))
			p("%s", vdpbf16ps(acc(i, 1), bhi, r))
		}
		p("LEAQ (BX)(DX*2), BX")
	}
	p("MOVQ CX, R11")
	p("SHRQ $1, R11")
	p("JZ %s_one", name)
	label("loop2")
	step(0, false)
	step(32, false)
	p("ADDQ $64, AX")
	p("DECQ R11")
	p("JNZ %s_loop2", name)
	label("one")
	p("ANDQ $1, CX")
	p("JZ %s_odd", name)
	step(0, false)
	p("ADDQ $32, AX")
	label("odd")
	p("MOVQ odd+56(FP), CX")
	p("TESTQ CX, CX")
	p("JZ %s_order", name)
	step(0, true)
	label("order")
	p("LEAQ directIdx<>(SB), R10")
	p("VMOVDQU32 (R10), Z%d", idx0)
	p("VMOVDQU32 64(R10), Z%d", idx1)
	for i := 0; i < mr; i++ {
		lo, hi := acc(i, 0), acc(i, 1)
		p("VMOVAPS Z%d, Z24", lo)
		p("VPERMT2PS Z%d, Z%d, Z%d", hi, idx0, lo)
		p("VPERMT2PS Z%d, Z%d, Z24", hi, idx1)
		p("VMOVAPS Z24, Z%d", hi)
	}
	genStore16(w, name, mr, nv, acc, true)
}

// genDirectIdx writes the VPERMT2PS indices of genDirect.
func genDirectIdx(w *bytes.Buffer) {
	idx := []int{0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23,
		8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31}
	fmt.Fprintf(w, "\n// directIdx: VPERMT2PS indices restoring the column order after VPUNPCK[LH]WD.\n")
	for i, v := range idx {
		fmt.Fprintf(w, "DATA directIdx<>+%d(SB)/4, $%d\n", 4*i, v)
	}
	fmt.Fprintf(w, "GLOBL directIdx<>(SB), RODATA|NOPTR, $128\n")
}
