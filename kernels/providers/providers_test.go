package providers_test

import (
	"strings"
	"testing"

	"github.com/meshrun/meshrun/kernels/providers"
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
		choice, kind, err := providers.Resolve(tc.device, tc.kernels)
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
		if providers.Compiled(name) {
			continue
		}
		_, _, err := providers.Resolve("", name)
		if err == nil || !strings.Contains(err.Error(), "go build -tags "+name) {
			t.Errorf("--kernels %s in a build without it: %v", name, err)
		}
	}
	if !providers.Compiled("cuda") {
		_, _, err := providers.Resolve("cuda", "")
		if err == nil || !strings.Contains(err.Error(), "go build -tags cuda") {
			t.Errorf("--device cuda in a build without it: %v", err)
		}
	}
}
