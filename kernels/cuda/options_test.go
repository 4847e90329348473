package cuda

import "testing"

// TestOptionsFrom: each variable sets its option.
func TestOptionsFrom(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	if o := OptionsFrom(env(nil)); o != (Options{}) {
		t.Errorf("no variables: %+v, want the zero Options", o)
	}
	all := OptionsFrom(env(map[string]string{EnvSync: "1", EnvTF32: "1", EnvLt: "0", EnvAttention: "kernels", EnvLayerNorm: "block", EnvBGrad: "split"}))
	if want := (Options{Sync: true, TF32: true, NoLt: true, AttnKernels: true, LayerNormBlock: true, BGradSplit: true}); all != want {
		t.Errorf("every variable: %+v, want %+v", all, want)
	}
	if o := OptionsFrom(env(map[string]string{EnvAttention: "fused"})); o != (Options{AttnFused: true}) {
		t.Errorf("%s=fused: %+v", EnvAttention, o)
	}
}

// TestCheckEnv: every value OptionsFrom reads passes, and a value it would
// ignore is refused with the variable and the values it takes.
func TestCheckEnv(t *testing.T) {
	for _, e := range envValues {
		for _, v := range append([]string{""}, e[1:]...) {
			if err := CheckEnv(func(k string) string { return map[string]string{e[0]: v}[k] }); err != nil {
				t.Errorf("%s=%q: %v", e[0], v, err)
			}
		}
	}
	err := CheckEnv(func(k string) string { return map[string]string{EnvAttention: "fsued"}[k] })
	if err == nil || err.Error() != "MESHRUN_CUDA_ATTENTION=fsued: want kernels or fused or gemm, or unset" {
		t.Errorf("MESHRUN_CUDA_ATTENTION=fsued: %v", err)
	}
}
