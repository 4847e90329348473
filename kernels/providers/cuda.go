//go:build cuda

package providers

import (
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cuda"
)

func init() {
	tagged = append(tagged, func(r *kernels.Registry, o Options) error {
		return r.Register(cuda.Name, func() (kernels.Provider, error) { return cuda.New(0, o.CUDA) })
	})
}
