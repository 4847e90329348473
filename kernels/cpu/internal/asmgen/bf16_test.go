package main

import (
	"bytes"
	"testing"
)

// TestEVEX checks the raw encodings against GNU as 2.40 (binutils), which
// assembled `vdpbf16ps %zmm31, %zmm30, %zmm0` (AT&T order: src2, src1, dst)
// and the others below into these bytes.
func TestEVEX(t *testing.T) {
	for _, c := range []struct {
		got  []byte
		want []byte
		what string
	}{
		{evex512(2, 0x52, 0, 30, 31), []byte{0x62, 0x92, 0x0e, 0x40, 0x52, 0xc7}, "vdpbf16ps zmm0, zmm30, zmm31"},
		{evex512(2, 0x52, 3, 2, 1), []byte{0x62, 0xf2, 0x6e, 0x48, 0x52, 0xd9}, "vdpbf16ps zmm3, zmm2, zmm1"},
		{evex512(2, 0x52, 24, 9, 17), []byte{0x62, 0x22, 0x36, 0x48, 0x52, 0xc1}, "vdpbf16ps zmm24, zmm9, zmm17"},
		{evex512(2, 0x52, 11, 16, 8), []byte{0x62, 0x52, 0x7e, 0x40, 0x52, 0xd8}, "vdpbf16ps zmm11, zmm16, zmm8"},
		{evex512(3, 0x72, 3, 2, 1), []byte{0x62, 0xf2, 0x6f, 0x48, 0x72, 0xd9}, "vcvtne2ps2bf16 zmm3, zmm2, zmm1"},
		{evex512(3, 0x72, 24, 9, 17), []byte{0x62, 0x22, 0x37, 0x48, 0x72, 0xc1}, "vcvtne2ps2bf16 zmm24, zmm9, zmm17"},
		{evex512(2, 0x72, 3, 0, 1), []byte{0x62, 0xf2, 0x7e, 0x48, 0x72, 0xd9}, "vcvtneps2bf16 ymm3, zmm1"},
		{evex512(2, 0x72, 24, 0, 17), []byte{0x62, 0x22, 0x7e, 0x48, 0x72, 0xc1}, "vcvtneps2bf16 ymm24, zmm17"},
	} {
		if !bytes.Equal(c.got, c.want) {
			t.Errorf("%s: % x, want % x", c.what, c.got, c.want)
		}
	}
}
