package cpu_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/tensor"
)

// TestLayerNormBFloat16Exact: bfloat16 layer norm, widened a few rows at a
// time, gives to the bit what the float32 op gives on the widened tensors,
// rounded once: rows past a block of 8 and widths off a multiple of 4, with
// and without beta, gradients written and added.
func TestLayerNormBFloat16Exact(t *testing.T) {
	p, _ := cpu.New(cpu.Options{Threads: 2})
	rng := rand.New(rand.NewPCG(5, 6))
	cast := func(dt tensor.DType, x *tensor.Tensor) *tensor.Tensor {
		y := tensor.New(dt, x.Shape()...)
		if err := p.Cast(y, x); err != nil {
			t.Fatal(err)
		}
		return y
	}
	bf := func(shape ...int) *tensor.Tensor { return cast(tensor.BFloat16, rnd(rng, shape...)) }
	same := func(what string, got, want32 *tensor.Tensor) {
		t.Helper()
		if w := cast(tensor.BFloat16, want32); !slices.Equal(got.BFloat16(), w.BFloat16()) {
			t.Errorf("%s: bfloat16 %v, the float32 op's rounded %v", what, got.BFloat16(), w.BFloat16())
		}
	}
	for _, shape := range [][2]int{{21, 13}, {8, 4}, {3, 1}, {67, 64}} {
		rows, d := shape[0], shape[1]
		x, gamma, beta, dy := bf(rows, d), bf(d), bf(d), bf(rows, d)
		for _, withBeta := range []bool{true, false} {
			b16, b32 := beta, cast(tensor.Float32, beta)
			if !withBeta {
				b16, b32 = nil, nil
			}
			y16, s16 := tensor.New(tensor.BFloat16, rows, d), tensor.New(tensor.Float32, rows, 2)
			y32, s32 := tensor.New(tensor.Float32, rows, d), tensor.New(tensor.Float32, rows, 2)
			if err := p.LayerNorm(y16, s16, x, gamma, b16, 1e-5); err != nil {
				t.Fatal(err)
			}
			if err := p.LayerNorm(y32, s32, cast(tensor.Float32, x), cast(tensor.Float32, gamma), b32, 1e-5); err != nil {
				t.Fatal(err)
			}
			same("y", y16, y32)
			if !slices.Equal(s16.Float32(), s32.Float32()) {
				t.Errorf("%v: statistics differ", shape)
			}
		}
		s := tensor.New(tensor.Float32, rows, 2)
		if err := p.LayerNorm(tensor.New(tensor.Float32, rows, d), s, cast(tensor.Float32, x), cast(tensor.Float32, gamma), nil, 1e-5); err != nil {
			t.Fatal(err)
		}
		for _, acc := range []bool{false, true} {
			dx16, dg16, db16 := tensor.New(tensor.BFloat16, rows, d), bf(d), bf(d)
			dx32, dg32, db32 := tensor.New(tensor.Float32, rows, d), cast(tensor.Float32, dg16), cast(tensor.Float32, db16)
			if err := p.LayerNormBackward(dx16, dg16, db16, dy, x, gamma, s, acc); err != nil {
				t.Fatal(err)
			}
			if err := p.LayerNormBackward(dx32, dg32, db32, cast(tensor.Float32, dy), cast(tensor.Float32, x), cast(tensor.Float32, gamma), s, acc); err != nil {
				t.Fatal(err)
			}
			same("dx", dx16, dx32)
			same("dgamma", dg16, dg32)
			same("dbeta", db16, db32)
		}
	}
}
