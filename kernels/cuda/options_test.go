package cuda

import "testing"

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
	for v, want := range map[string]int{"1": 1, "32": MaxLtAlgos, "0": 0, "33": 0, "-4": 0, "eight": 0, "": 0} {
		if got := OptionsFrom(env(map[string]string{EnvLtAlgos: v})).LtAlgos; got != want {
			t.Errorf("%s=%q: LtAlgos %d, want %d", EnvLtAlgos, v, got, want)
		}
	}
}
