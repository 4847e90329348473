// Package catalog is what a binary knows of the kernels providers without
// building one: their names, the device each runs on, the build tag that
// compiles each in and whether this binary has it, their dtypes, and the
// checks of --device, --kernels and --dtype. It imports no provider, so a
// program checks a job's flags without building any provider's code (the
// worker answers the launcher's check of them with it: the launcher links no
// kernels package). kernels/providers builds the providers themselves; its
// tests hold this catalog to what they report.
package catalog

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/tensor"
)

// The environment variables that carry --device, --kernels and --dtype from
// the launcher to every rank.
const (
	EnvDevice  = "MESHRUN_DEVICE"
	EnvKernels = "MESHRUN_KERNELS"
	EnvDType   = "MESHRUN_DTYPE"
)

// provider is one provider meshrun has, compiled in or not.
type provider struct {
	device tensor.DeviceKind
	tag    string // the build tag that compiles it in; "" for every build
	dtypes []tensor.DType
}

var providers = map[string]provider{
	"cpu":      {tensor.CPU, "", []tensor.DType{tensor.Float32, tensor.Float64, tensor.BFloat16}},
	"sim":      {tensor.Sim, "", []tensor.DType{tensor.Float32, tensor.Float64, tensor.BFloat16}},
	"openblas": {tensor.CPU, "openblas", []tensor.DType{tensor.Float32, tensor.Float64}},
	"cuda":     {tensor.CUDA, "cuda", []tensor.DType{tensor.Float32, tensor.Float64, tensor.BFloat16}},
}

// tagged holds the build tags this binary was built with, of those that
// compile a provider in (set by this package's tagged files).
var tagged = map[string]bool{}

// Compiled reports whether provider name is compiled into this binary.
func Compiled(name string) bool {
	p, ok := providers[name]
	return ok && (p.tag == "" || tagged[p.tag])
}

// BuildTag is the build tag that compiles provider name in ("" for the
// providers every build has, and for unknown names).
func BuildTag(name string) string { return providers[name].tag }

// BuildCommand is how to build the launcher and worker with a build tag.
func BuildCommand(tag string) string {
	return fmt.Sprintf("go build -tags %s -o bin/ ./cmd/launcher ./cmd/worker", tag)
}

// DeviceOf returns the device provider name runs on, whether or not this
// binary has it.
func DeviceOf(name string) (tensor.DeviceKind, bool) {
	p, ok := providers[name]
	return p.device, ok
}

// Known lists every provider name meshrun has, compiled in or not.
func Known() []string {
	names := make([]string, 0, len(providers))
	for n := range providers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// DTypes lists the element types provider name computes in, whether or not
// this binary has it.
func DTypes(name string) ([]tensor.DType, error) {
	p, ok := providers[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", kernels.ErrUnknownProvider, name)
	}
	return slices.Clone(p.dtypes), nil
}

// CheckDType reports an error naming the provider when a provider of choice
// has no kernels for dt (a dtype is never quietly run in another).
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

// CheckCompiled refuses, naming the build command, the providers of choice
// this binary lacks.
func CheckCompiled(choice kernels.Choice) error {
	for _, name := range choice.Names() {
		if _, known := DeviceOf(name); known && !Compiled(name) {
			return fmt.Errorf("%w: %s: this binary was built without it; build with: %s", kernels.ErrUnknownProvider, name, BuildCommand(BuildTag(name)))
		}
	}
	return nil
}

// Resolve checks a --device and a --kernels value (either may be empty)
// before anything runs, and returns the kernels choice and the device the
// rank's tensors live on: a device or provider this binary lacks is an error
// naming the build command; kernels of one device asked to run on another
// are an error. An empty device is the kernels' device (cpu when both are
// empty); an empty kernels value is the device's own provider.
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
