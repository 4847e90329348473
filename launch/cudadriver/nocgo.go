//go:build !cgo

package cudadriver

import "fmt"

func count(lib string) (int, error) {
	return 0, fmt.Errorf("cannot load %s: this binary was built without cgo (CGO_ENABLED=0)", lib)
}
