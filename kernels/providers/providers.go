// Package providers assembles the registry of every kernels provider compiled
// into the binary: "cpu" and "sim" always, "openblas" with the openblas build
// tag, "cuda" with the cuda build tag. What is known of the providers without
// building one (names, devices, build tags, dtypes, the --device and --kernels
// checks) is kernels/providers/catalog, which the launcher uses instead of this
// package so that it links no provider; the names below forward to it.
package providers

import (
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/kernels/cuda"
	"github.com/meshrun/meshrun/kernels/providers/catalog"
	"github.com/meshrun/meshrun/kernels/sim"
	"github.com/meshrun/meshrun/tensor"
)

// tagged holds the registrations of providers behind build tags (see the
// tagged files of this package); it is filled by init functions only.
var tagged []func(*kernels.Registry, Options) error

// Options are the settings of the providers a registry builds, given by
// whoever builds them (the worker reads them from its environment: package
// job). The zero value is every provider's default.
type Options struct {
	// CUDA is the cuda provider's (a build without the cuda tag ignores it).
	CUDA cuda.Options
}

// Registry returns a new registry holding every compiled-in provider, each
// with its default options (RegistryWith).
func Registry() *kernels.Registry { return RegistryWith(Options{}) }

// RegistryWith returns a new registry holding every compiled-in provider,
// built with o. cpu and sim use their default options (GOMAXPROCS threads,
// best micro-kernel); each dispatcher built from it gets its own sim device
// memory.
func RegistryWith(o Options) *kernels.Registry {
	r := kernels.NewRegistry()
	must(r.Register(cpu.Name, func() (kernels.Provider, error) { return cpu.New(cpu.Options{}) }))
	must(r.Register(sim.Name, func() (kernels.Provider, error) { return sim.New(sim.Options{}) }))
	for _, reg := range tagged {
		must(reg(r, o))
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
// default registry (every provider with its default options).
// A provider this binary lacks is an error naming the build command.
func New(choice string, log kernels.Logger) (*kernels.Dispatcher, error) {
	c, err := kernels.ParseChoice(choice)
	if err != nil {
		return nil, err
	}
	if err := catalog.CheckCompiled(c); err != nil {
		return nil, err
	}
	return Registry().NewDispatcher(c, log)
}

// The environment variables that carry --device, --kernels and --dtype from
// the launcher to every rank.
const (
	EnvDevice  = catalog.EnvDevice
	EnvKernels = catalog.EnvKernels
	EnvDType   = catalog.EnvDType
)

// BuildTag is the build tag that compiles provider name in ("" for the
// providers every build has).
func BuildTag(name string) string { return catalog.BuildTag(name) }

// Compiled reports whether provider name is compiled into this binary.
func Compiled(name string) bool { return catalog.Compiled(name) }

// DeviceOf returns the device provider name runs on, whether or not this binary
// has it.
func DeviceOf(name string) (tensor.DeviceKind, bool) { return catalog.DeviceOf(name) }

// Known lists every provider name meshrun has, compiled in or not.
func Known() []string { return catalog.Known() }

// DTypes lists the element types provider name computes in (the catalog's
// list, which this package's tests hold to the providers' own DTypes).
func DTypes(name string) ([]tensor.DType, error) { return catalog.DTypes(name) }

// CheckDType reports an error naming the provider when a provider of choice has
// no kernels for dt (a dtype is never quietly run in another).
func CheckDType(choice kernels.Choice, dt tensor.DType) error { return catalog.CheckDType(choice, dt) }

// BuildCommand is how to build the launcher and worker with a build tag.
func BuildCommand(tag string) string { return catalog.BuildCommand(tag) }

// Resolve checks a --device and a --kernels value before anything runs
// (catalog.Resolve).
func Resolve(device, kernelsSpec string) (kernels.Choice, tensor.DeviceKind, error) {
	return catalog.Resolve(device, kernelsSpec)
}
