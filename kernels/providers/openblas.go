//go:build openblas

package providers

import (
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/openblas"
)

func init() {
	tagged = append(tagged, func(r *kernels.Registry, _ Options) error {
		return r.Register(openblas.Name, func() (kernels.Provider, error) { return openblas.New(0) })
	})
}
