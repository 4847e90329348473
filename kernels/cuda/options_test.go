package cuda

import (
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// TestOptionsFrom: each variable sets its option, and a value out of range
// or not a number leaves the default.
func TestOptionsFrom(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	if o := OptionsFrom(env(nil)); o != (Options{}) {
		t.Errorf("no variables: %+v, want the zero Options", o)
	}
	all := OptionsFrom(env(map[string]string{EnvSync: "1", EnvTF32: "1", EnvLt: "0", EnvAttention: "kernels", EnvBGrad: "split", EnvLtAlgos: "16"}))
	if want := (Options{Sync: true, TF32: true, NoLt: true, AttnKernels: true, BGradSplit: true, LtAlgos: 16}); all != want {
		t.Errorf("every variable: %+v, want %+v", all, want)
	}
	if o := OptionsFrom(env(map[string]string{EnvBGrad: "fused"})); !o.BGradFused || o.BGradSplit {
		t.Errorf("%s=fused: %+v", EnvBGrad, o)
	}
	for v, want := range map[string]int{"1": 1, "32": MaxLtAlgos, "0": 0, "33": 0, "-4": 0, "eight": 0, "": 0} {
		if got := OptionsFrom(env(map[string]string{EnvLtAlgos: v})).LtAlgos; got != want {
			t.Errorf("%s=%q: LtAlgos %d, want %d", EnvLtAlgos, v, got, want)
		}
	}
}

// TestBGradSplit: a bfloat16 weight gradient over 512 tokens or more runs
// its bias gradient apart, a smaller or float32 one on the epilogue, unless
// MESHRUN_BGRAD says otherwise.
func TestBGradSplit(t *testing.T) {
	for _, c := range []struct {
		o     Options
		dt    tensor.DType
		k     int
		split bool
	}{
		{Options{}, tensor.BFloat16, 512, true},
		{Options{}, tensor.BFloat16, 8192, true},
		{Options{}, tensor.BFloat16, 511, false},
		{Options{}, tensor.Float32, 8192, false},
		{Options{BGradFused: true}, tensor.BFloat16, 8192, false},
		{Options{BGradSplit: true}, tensor.Float32, 8, true},
	} {
		g := kernels.GemmParams{M: 64, N: 64, K: c.k, TransA: true, DType: c.dt, Epilogue: kernels.EpilogueBGrad}
		if got := bgradSplit(c.o, g); got != c.split {
			t.Errorf("%+v, %v, K %d: split %v, want %v", c.o, c.dt, c.k, got, c.split)
		}
	}
}
