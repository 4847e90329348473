package catalog_test

import (
	"strings"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/providers/catalog"
	"github.com/meshrun/meshrun/tensor"
)

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		device, kernels string
		want            tensor.DeviceKind
		choice, err     string
	}{
		{"", "", tensor.CPU, "cpu", ""},
		{"sim", "", tensor.Sim, "sim", ""},
		{"", "sim", tensor.Sim, "sim", ""},
		{"cpu", "cpu,gelu_forward=cpu", tensor.CPU, "cpu,gelu_forward=cpu", ""},
		{"cpu", "sim", 0, "", "provider sim runs on sim, the rank's tensors are on cpu"},
		{"", "cpu,gemm=sim", 0, "", "provider sim runs on sim"},
		{"", "nosuch", 0, "", `unknown provider "nosuch"`},
		{"gpu", "", 0, "", `--device "gpu"`},
		{"", "cpu,gemm", 0, "", "bad choice"},
	} {
		choice, kind, err := catalog.Resolve(tc.device, tc.kernels)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Resolve(%q, %q) = %v, want an error with %q", tc.device, tc.kernels, err, tc.err)
			}
			continue
		}
		if err != nil || kind != tc.want || choice.String() != tc.choice {
			t.Errorf("Resolve(%q, %q) = %v %v %v", tc.device, tc.kernels, choice, kind, err)
		}
	}
	// A provider this build lacks is refused with the command that builds it.
	for _, name := range []string{"cuda", "openblas"} {
		if catalog.Compiled(name) {
			continue
		}
		_, _, err := catalog.Resolve("", name)
		if err == nil || !strings.Contains(err.Error(), "go build -tags "+name) {
			t.Errorf("--kernels %s in a build without it: %v", name, err)
		}
	}
	if !catalog.Compiled("cuda") {
		_, _, err := catalog.Resolve("cuda", "")
		if err == nil || !strings.Contains(err.Error(), "go build -tags cuda") {
			t.Errorf("--device cuda in a build without it: %v", err)
		}
	}
}

// TestCheckDType: a dtype a provider of the choice lacks is refused naming
// it, whether or not this binary has the provider.
func TestCheckDType(t *testing.T) {
	for _, tc := range []struct {
		choice string
		dt     tensor.DType
		err    string
	}{
		{"cpu", tensor.BFloat16, ""},
		{"cuda", tensor.BFloat16, ""},
		{"openblas", tensor.Float32, ""},
		{"openblas", tensor.BFloat16, "provider openblas has no bfloat16 kernels"},
		{"cpu,gemm=openblas", tensor.BFloat16, "provider openblas has no bfloat16 kernels"},
	} {
		c, err := kernels.ParseChoice(tc.choice)
		if err != nil {
			t.Fatal(err)
		}
		err = catalog.CheckDType(c, tc.dt)
		if (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("CheckDType(%s, %v) = %v, want %q", tc.choice, tc.dt, err, tc.err)
		}
	}
}

// TestCompiled: cpu and sim are in every build; cuda and openblas exactly in
// the builds with their tags (the providers package's tests check this
// against the registry).
func TestCompiled(t *testing.T) {
	for _, name := range catalog.Known() {
		tag := catalog.BuildTag(name)
		if tag == "" && !catalog.Compiled(name) {
			t.Errorf("%s has no build tag but is not compiled in", name)
		}
		if tag != "" && tag != name {
			t.Errorf("%s: build tag %q", name, tag)
		}
	}
	if catalog.Compiled("nosuch") || catalog.BuildTag("nosuch") != "" {
		t.Errorf("an unknown provider is compiled in")
	}
}
