//go:build openblas

package main

import (
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/openblas"
)

// newPeer returns the OpenBLAS provider (same process, so measurements interleave
// with meshrun's) and a description of the library.
func newPeer(threads int) (kernels.Kernels, string) {
	p, err := openblas.New(threads)
	if err != nil {
		panic(err)
	}
	return p, openblas.Config()
}
