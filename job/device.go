package job

import (
	"flag"
	"fmt"
	"strings"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/runlog"
	"github.com/meshrun/meshrun/tensor"
)

// Environment variables the launcher sets on every rank (its --device and
// --kernels); a workload's own flags win over them.
const (
	EnvDevice  = "MESHRUN_DEVICE"
	EnvKernels = "MESHRUN_KERNELS"
)

// deviceFlags are the --device and --kernels flags every compute workload has.
type deviceFlags struct {
	device, kernels string
}

func (d *deviceFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.device, "device", "", "device of the rank's tensors: cpu, sim or cuda (default $"+EnvDevice+", else the kernels' device, else cpu)")
	fs.StringVar(&d.kernels, "kernels", "", "kernel provider, optionally per op: cpu, sim, cuda, openblas, or e.g. cpu,gemm=openblas (default $"+EnvKernels+", else the device's own)")
}

// rankDevice is a validated device choice: building it gives each rank its
// kernels and memory.
type rankDevice struct {
	kind   tensor.DeviceKind
	choice kernels.Choice
	log    *runlog.Rank
}

// buildCommand is how to build a launcher and worker with a provider's tag.
func buildCommand(tag string) string {
	return fmt.Sprintf("go build -tags %s -o bin/ ./cmd/launcher ./cmd/worker", tag)
}

// resolve checks the flags (and the environment behind them) before any rank
// starts: a device or provider this binary lacks, or kernels of one device
// asked to run on another, is a usage error naming the fix.
func (d deviceFlags) resolve(env Env) (rankDevice, error) {
	dev, kern := d.device, d.kernels
	if dev == "" {
		dev = env.Getenv(EnvDevice)
	}
	if kern == "" {
		kern = env.Getenv(EnvKernels)
	}
	var kind tensor.DeviceKind
	if dev != "" {
		k, err := tensor.ParseDeviceKind(dev)
		if err != nil {
			return rankDevice{}, fmt.Errorf("--device %q: want cpu, sim or cuda", dev)
		}
		kind = k
		if !providers.Compiled(kind.String()) {
			return rankDevice{}, fmt.Errorf("--device %s: this worker was built without %s support; build it with: %s",
				dev, strings.ToUpper(dev), buildCommand(providers.BuildTag(kind.String())))
		}
	}
	if kern == "" {
		kern = kind.String()
	}
	choice, err := kernels.ParseChoice(kern)
	if err != nil {
		return rankDevice{}, fmt.Errorf("--kernels: %v", err)
	}
	for i, name := range choice.Names() {
		pk, ok := providers.DeviceOf(name)
		if !ok {
			return rankDevice{}, fmt.Errorf("--kernels: unknown provider %q (known: %s)", name, strings.Join(providers.Known(), ", "))
		}
		if !providers.Compiled(name) {
			return rankDevice{}, fmt.Errorf("--kernels %s: this worker was built without the %s provider; build it with: %s",
				kern, name, buildCommand(providers.BuildTag(name)))
		}
		if i == 0 && dev == "" {
			kind = pk
		}
		if pk != kind {
			return rankDevice{}, fmt.Errorf("--kernels %s: provider %s runs on %v, the rank's tensors are on %v (--device)", kern, name, pk, kind)
		}
	}
	return rankDevice{kind: kind, choice: choice, log: env.Run}, nil
}

// build makes one rank's device: its own dispatcher (and, on sim, its own
// device memory). The first call of each kernel is logged.
func (d rankDevice) build() (*kernels.Dispatcher, error) {
	var logf kernels.Logger
	if d.log != nil && d.log.Log != nil {
		logf = d.log.Log.Sugar().Infow
	}
	return providers.Registry().NewDispatcher(d.choice, logf)
}
