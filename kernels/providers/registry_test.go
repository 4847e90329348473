package providers_test

import (
	"slices"
	"testing"

	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/kernels/providers/catalog"
)

// TestCatalogMatchesRegistry: the catalog, which the launcher reads instead
// of building providers, says of each provider what the registry and the
// provider itself say: compiled in exactly when registered, its device, its
// dtypes (cuda's are checked in cuda builds by cuda_test.go: building it here
// would open a GPU).
func TestCatalogMatchesRegistry(t *testing.T) {
	reg := providers.Registry()
	for _, name := range catalog.Known() {
		if got, want := catalog.Compiled(name), slices.Contains(reg.Names(), name); got != want {
			t.Errorf("catalog.Compiled(%s) = %v, the registry has it: %v", name, got, want)
		}
	}
	for _, name := range reg.Names() {
		dev, known := catalog.DeviceOf(name)
		if !known {
			t.Errorf("the registry has %s, the catalog does not know it", name)
			continue
		}
		if name == "cuda" {
			continue
		}
		f, err := reg.Factory(name)
		if err != nil {
			t.Fatal(err)
		}
		p, err := f()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		dts, _ := catalog.DTypes(name)
		if p.Device() != dev || !slices.Equal(p.DTypes(), dts) {
			t.Errorf("%s: the provider runs on %v in %v, the catalog says %v in %v", name, p.Device(), p.DTypes(), dev, dts)
		}
	}
}
