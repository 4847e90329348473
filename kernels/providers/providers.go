// Package providers assembles the registry of every kernels provider compiled
// into the binary: "cpu" always, "openblas" with the openblas build tag, "cuda"
// with the cuda build tag.
package providers

import (
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
)

// tagged holds the registrations of providers behind build tags (see the
// tagged files of this package); it is filled by init functions only.
var tagged []func(*kernels.Registry) error

// Registry returns a new registry holding every compiled-in provider. cpu uses
// the default options (GOMAXPROCS threads, best micro-kernel).
func Registry() *kernels.Registry {
	r := kernels.NewRegistry()
	must(r.Register(cpu.Name, func() (kernels.Provider, error) { return cpu.New(cpu.Options{}) }))
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
