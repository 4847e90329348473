//go:build !cuda

package launch

import "errors"

// gpuCount needs CUDA: this launcher was built without the cuda tag.
func gpuCount() (int, error) {
	return 0, errors.New("this launcher was built without CUDA (go build -tags cuda); use N or cpu")
}
