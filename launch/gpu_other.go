//go:build !cuda

package launch

import "errors"

// launcherCUDA reports that this launcher was built with the cuda tag; this
// one was not, and refuses cuda ranks.
const launcherCUDA = false

// gpuCount needs CUDA: this launcher was built without the cuda tag.
func gpuCount() (int, error) {
	return 0, errors.New("this launcher was built without CUDA (go build -tags cuda); use N or cpu")
}
