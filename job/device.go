package job

import (
	"flag"
	"fmt"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cuda"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/runlog"
	"github.com/meshrun/meshrun/tensor"
)

// Environment variables the launcher sets on every rank (its --device and
// --kernels); a workload's own flags win over them.
const (
	EnvDevice  = providers.EnvDevice
	EnvKernels = providers.EnvKernels
)

// deviceFlags are the --device and --kernels flags every compute workload has.
type deviceFlags struct {
	device, kernels, dtype string
}

func (d *deviceFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.device, "device", "", "`DEVICE` of the rank's tensors: cpu, sim or cuda (default $"+EnvDevice+", else the kernels' device, else cpu)")
	fs.StringVar(&d.kernels, "kernels", "", "kernel providers, `SPEC`: cpu, sim, cuda, openblas, or e.g. cpu,gemm=openblas (default $"+EnvKernels+", else the device's own)")
	fs.StringVar(&d.dtype, "dtype", "", "compute `DTYPE`: float32 or bfloat16; parameters and SGD stay float32 (default $"+providers.EnvDType+", else float32)")
}

// rankDevice is a validated device choice: building it gives each rank its
// kernels and memory.
type rankDevice struct {
	kind   tensor.DeviceKind
	choice kernels.Choice
	dtype  tensor.DType
	opts   providers.Options // the providers' switches (MESHRUN_CUDA_SYNC, ...)
	log    *runlog.Rank
}

// resolve checks the flags (and the environment behind them) before any rank
// starts (see providers.Resolve), and reads the providers' options from env
// (cuda.OptionsFrom: MESHRUN_CUDA_SYNC, MESHRUN_TF32, MESHRUN_CUBLASLT,
// MESHRUN_CUDA_ATTENTION, MESHRUN_CUDA_LAYERNORM, MESHRUN_BGRAD).
func (d deviceFlags) resolve(env Env) (rankDevice, error) {
	dev, kern := d.device, d.kernels
	if dev == "" {
		dev = env.Getenv(EnvDevice)
	}
	if kern == "" {
		kern = env.Getenv(EnvKernels)
	}
	choice, kind, err := providers.Resolve(dev, kern)
	if err != nil {
		return rankDevice{}, err
	}
	dts := d.dtype
	if dts == "" {
		dts = env.Getenv(providers.EnvDType)
	}
	if dts == "" {
		dts = "float32"
	}
	dt, err := tensor.ParseDType(dts)
	if err != nil || (dt != tensor.Float32 && dt != tensor.BFloat16) {
		return rankDevice{}, fmt.Errorf("--dtype %q: want float32 or bfloat16", dts)
	}
	if err := providers.CheckDType(choice, dt); err != nil {
		return rankDevice{}, err
	}
	if err := cuda.CheckEnv(env.Getenv); err != nil {
		return rankDevice{}, err
	}
	opts := providers.Options{CUDA: cuda.OptionsFrom(env.Getenv)}
	return rankDevice{kind: kind, choice: choice, dtype: dt, opts: opts, log: env.Run}, nil
}

// build makes one rank's device: its own dispatcher (and, on sim, its own
// device memory), its providers built with the options resolve read. The
// first call of each kernel is logged.
func (d rankDevice) build() (*kernels.Dispatcher, error) {
	var logf kernels.Logger
	if d.log != nil && d.log.Log != nil {
		logf = d.log.Log.Sugar().Infow
	}
	return providers.RegistryWith(d.opts).NewDispatcher(d.choice, logf)
}
