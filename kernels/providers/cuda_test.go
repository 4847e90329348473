//go:build cuda

package providers_test

import (
	"slices"
	"testing"

	"github.com/meshrun/meshrun/kernels/cuda"
	"github.com/meshrun/meshrun/kernels/providers/catalog"
)

// TestCatalogCUDA: the catalog's cuda entry is the provider's own device and
// dtypes, asked of a provider value that opens no GPU.
func TestCatalogCUDA(t *testing.T) {
	p := new(cuda.Provider)
	dev, _ := catalog.DeviceOf(cuda.Name)
	dts, _ := catalog.DTypes(cuda.Name)
	if p.Device() != dev || !slices.Equal(p.DTypes(), dts) {
		t.Errorf("cuda runs on %v in %v, the catalog says %v in %v", p.Device(), p.DTypes(), dev, dts)
	}
}
