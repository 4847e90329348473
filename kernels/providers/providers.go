// Package providers assembles the registry of every kernels provider compiled
// into the binary: "cpu" and "sim" always, "openblas" with the openblas build
// tag, "cuda" with the cuda build tag.
package providers

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/kernels/sim"
	"github.com/meshrun/meshrun/tensor"
)

// tagged holds the registrations of providers behind build tags (see the
// tagged files of this package); it is filled by init functions only.
var tagged []func(*kernels.Registry) error

// Registry returns a new registry holding every compiled-in provider. cpu and
// sim use the default options (GOMAXPROCS threads, best micro-kernel); each
// dispatcher built from it gets its own sim device memory.
func Registry() *kernels.Registry {
	r := kernels.NewRegistry()
	must(r.Register(cpu.Name, func() (kernels.Provider, error) { return cpu.New(cpu.Options{}) }))
	must(r.Register(sim.Name, func() (kernels.Provider, error) { return sim.New(sim.Options{}) }))
	for _, reg := range tagged {
		must(reg(r))
	}
	return r
}

// must panics on a registration error, which can only be a programming error
// (a name registered twice).
func must(err error) {
	if err != nil {
		panic(err)
	}
}

// New is a shortcut: parse a --kernels value and build a dispatcher from the
// default registry.
// A provider this binary lacks is an error naming the build command.
func New(choice string, log kernels.Logger) (*kernels.Dispatcher, error) {
	c, err := kernels.ParseChoice(choice)
	if err != nil {
		return nil, err
	}
	for _, name := range c.Names() {
		if _, known := DeviceOf(name); known && !Compiled(name) {
			return nil, fmt.Errorf("%w: %s: this binary was built without it; build with: %s", kernels.ErrUnknownProvider, name, BuildCommand(BuildTag(name)))
		}
	}
	return Registry().NewDispatcher(c, log)
}

// BuildTag is the build tag that compiles provider name in ("" for the
// providers every build has).
func BuildTag(name string) string {
	switch name {
	case "cuda", "openblas":
		return name
	}
	return ""
}

// Compiled reports whether provider name is compiled into this binary.
func Compiled(name string) bool { return slices.Contains(Registry().Names(), name) }

// devices is the device every known provider runs on, compiled in or not.
var devices = map[string]tensor.DeviceKind{
	"cpu": tensor.CPU, "openblas": tensor.CPU, "sim": tensor.Sim, "cuda": tensor.CUDA,
}

// DeviceOf returns the device provider name runs on, whether or not this binary
// has it.
func DeviceOf(name string) (tensor.DeviceKind, bool) {
	d, ok := devices[name]
	return d, ok
}

// Known lists every provider name meshrun has, compiled in or not.
func Known() []string {
	names := make([]string, 0, len(devices))
	for n := range devices {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// The environment variables that carry --device, --kernels and --dtype from
// the launcher to every rank.
const (
	EnvDevice  = "MESHRUN_DEVICE"
	EnvKernels = "MESHRUN_KERNELS"
	EnvDType   = "MESHRUN_DTYPE"
)

// cudaDTypes are the cuda provider's dtypes, known without opening a GPU.
var cudaDTypes = []tensor.DType{tensor.Float32, tensor.Float64, tensor.BFloat16}

// DTypes lists the element types provider name computes in: asked of the
// provider itself, but for cuda (which would open a GPU).
func DTypes(name string) ([]tensor.DType, error) {
	if name == "cuda" {
		return cudaDTypes, nil
	}
	f, err := Registry().Factory(name)
	if err != nil {
		return nil, err
	}
	p, err := f()
	if err != nil {
		return nil, err
	}
	return p.DTypes(), nil
}

// CheckDType reports an error naming the provider when a provider of choice has
// no kernels for dt (a dtype is never quietly run in another).
func CheckDType(choice kernels.Choice, dt tensor.DType) error {
	for _, name := range choice.Names() {
		dts, err := DTypes(name)
		if err != nil {
			return err
		}
		if !slices.Contains(dts, dt) {
			return fmt.Errorf("--dtype %v: provider %s has no %v kernels (it has %v)", dt, name, dt, dts)
		}
	}
	return nil
}

// BuildCommand is how to build the launcher and worker with a build tag.
func BuildCommand(tag string) string {
	return fmt.Sprintf("go build -tags %s -o bin/ ./cmd/launcher ./cmd/worker", tag)
}

// Resolve checks a --device and a --kernels value (either may be empty) before
// anything runs, and returns the kernels choice and the device the rank's
// tensors live on: a device or provider this binary lacks is an error naming
// the build command; kernels of one device asked to run on another are an
// error. An empty device is the kernels' device (cpu when both are empty); an
// empty kernels value is the device's own provider.
func Resolve(device, kernelsSpec string) (kernels.Choice, tensor.DeviceKind, error) {
	var kind tensor.DeviceKind
	if device != "" {
		k, err := tensor.ParseDeviceKind(device)
		if err != nil {
			return kernels.Choice{}, 0, fmt.Errorf("--device %q: want cpu, sim or cuda", device)
		}
		kind = k
		if !Compiled(kind.String()) {
			return kernels.Choice{}, 0, fmt.Errorf("--device %s: this binary was built without %s support; build with: %s",
				device, strings.ToUpper(device), BuildCommand(BuildTag(kind.String())))
		}
	}
	if kernelsSpec == "" {
		kernelsSpec = kind.String()
	}
	choice, err := kernels.ParseChoice(kernelsSpec)
	if err != nil {
		return kernels.Choice{}, 0, fmt.Errorf("--kernels: %v", err)
	}
	for i, name := range choice.Names() {
		pk, ok := DeviceOf(name)
		if !ok {
			return kernels.Choice{}, 0, fmt.Errorf("--kernels %s: unknown provider %q (known: %s)", kernelsSpec, name, strings.Join(Known(), ", "))
		}
		if !Compiled(name) {
			return kernels.Choice{}, 0, fmt.Errorf("--kernels %s: this binary was built without the %s provider; build with: %s",
				kernelsSpec, name, BuildCommand(BuildTag(name)))
		}
		if i == 0 && device == "" {
			kind = pk
		}
		if pk != kind {
			return kernels.Choice{}, 0, fmt.Errorf("--kernels %s: provider %s runs on %v, the rank's tensors are on %v (--device)", kernelsSpec, name, pk, kind)
		}
	}
	return choice, kind, nil
}
