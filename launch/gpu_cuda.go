//go:build cuda

package launch

import "github.com/meshrun/meshrun/launch/cudadriver"

// launcherCUDA reports that this launcher was built with the cuda tag: it
// counts GPUs and places cuda ranks on them.
const launcherCUDA = true

// gpuCount is the number of CUDA devices this process sees, asked of the
// driver loaded at run time (the launcher does not link it: it starts, and
// runs cpu and sim jobs, on a machine without one). No driver is an error
// naming the library the loader could not open.
func gpuCount() (int, error) { return cudadriver.Count("") }
