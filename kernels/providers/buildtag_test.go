package providers_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/providers"
)

// TestNewNamesTheBuild: New refuses a provider this build lacks with the
// build command that has it, as Resolve does (alone or per op).
func TestNewNamesTheBuild(t *testing.T) {
	for _, name := range []string{"cuda", "openblas"} {
		if providers.Compiled(name) {
			continue
		}
		for _, choice := range []string{name, "cpu,gemm=" + name} {
			_, err := providers.New(choice, nil)
			if !errors.Is(err, kernels.ErrUnknownProvider) || !strings.Contains(err.Error(), "go build -tags "+name) {
				t.Errorf("New(%q) in a build without %s: %v", choice, name, err)
			}
		}
	}
	if _, err := providers.New("nosuch", nil); !errors.Is(err, kernels.ErrUnknownProvider) || strings.Contains(err.Error(), "-tags") {
		t.Errorf("New(nosuch): %v", err)
	}
}
