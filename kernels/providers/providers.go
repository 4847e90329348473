// Package providers assembles the registry of every kernels provider compiled
// into the binary: "cpu" and "sim" always, "openblas" with the openblas build
// tag, "cuda" with the cuda build tag.
package providers

import (
	"slices"

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
func New(choice string, log kernels.Logger) (*kernels.Dispatcher, error) {
	c, err := kernels.ParseChoice(choice)
	if err != nil {
		return nil, err
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
