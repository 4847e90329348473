package kernels

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/meshrun/meshrun/tensor"
)

// Factory builds a provider. It is called once per Dispatcher that uses the name.
type Factory func() (Provider, error)

// Registry maps provider names to factories. It is an ordinary value: build one,
// register providers, hand it around (kernels/providers.Default returns one with
// every provider compiled into the binary).
type Registry struct {
	mu sync.Mutex
	f  map[string]Factory
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{f: map[string]Factory{}} }

// Register adds a provider factory; a name can be registered once.
func (r *Registry) Register(name string, f Factory) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if name == "" || f == nil {
		return fmt.Errorf("kernels: register: empty name or nil factory")
	}
	if _, dup := r.f[name]; dup {
		return fmt.Errorf("kernels: provider %q registered twice", name)
	}
	r.f[name] = f
	return nil
}

// Names returns the registered names, sorted.
func (r *Registry) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.f))
	for n := range r.f {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (r *Registry) factory(name string) (Factory, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f, ok := r.f[name]
	if !ok {
		names := make([]string, 0, len(r.f))
		for n := range r.f {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("%w: %q (registered: %s)", ErrUnknownProvider, name, strings.Join(names, ", "))
	}
	return f, nil
}

// Choice is which provider runs which op: Default for every op, PerOp overriding
// single ops. A provider only serves ops on its own device; other devices get
// their default provider (the one named like the device: "cpu", "cuda").
type Choice struct {
	Default string
	PerOp   map[Op]string
}

// ParseChoice reads a --kernels flag value: a provider name, optionally followed
// by per-op overrides, e.g. "openblas" or "cpu,gemm=openblas,gelu_forward=cpu".
func ParseChoice(s string) (Choice, error) {
	var c Choice
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		name, val, isOp := strings.Cut(part, "=")
		switch {
		case !isOp && i == 0 && part != "":
			c.Default = part
		case isOp && val != "":
			op, err := ParseOp(strings.TrimSpace(name))
			if err != nil {
				return Choice{}, err
			}
			if c.PerOp == nil {
				c.PerOp = map[Op]string{}
			}
			c.PerOp[op] = strings.TrimSpace(val)
		default:
			return Choice{}, fmt.Errorf("kernels: bad choice %q: want NAME[,op=NAME...]", s)
		}
	}
	return c, nil
}

// String is the inverse of ParseChoice.
func (c Choice) String() string {
	parts := []string{c.Default}
	for _, op := range Ops() {
		if n, ok := c.PerOp[op]; ok {
			parts = append(parts, op.String()+"="+n)
		}
	}
	return strings.Join(parts, ",")
}

// Logger receives structured log lines; (*zap.SugaredLogger).Infow fits, and so
// does a no-op func. The dispatcher logs each fallback once, when it is built.
type Logger func(msg string, keysAndValues ...any)

// Dispatcher routes each (device, op) to one provider, fixed when it is built.
// It implements Kernels: the device is taken from the output operand. It is safe
// for concurrent use if its providers are.
type Dispatcher struct {
	table     [tensor.CUDA + 1][numOps]Provider
	providers map[string]Provider
	choice    Choice
}

// NewDispatcher builds the providers named in choice (and "cpu", the host's
// default) and fixes the route of every op. An unknown name is an error. An op
// that the chosen provider lacks goes to its device's default provider, and the
// fallback is logged once here.
func (r *Registry) NewDispatcher(choice Choice, log Logger) (*Dispatcher, error) {
	if log == nil {
		log = func(string, ...any) {}
	}
	if choice.Default == "" {
		choice.Default = "cpu"
	}
	d := &Dispatcher{providers: map[string]Provider{}, choice: choice}
	names := []string{"cpu", choice.Default}
	for _, op := range Ops() {
		if n, ok := choice.PerOp[op]; ok {
			names = append(names, n)
		}
	}
	for _, n := range names {
		if _, done := d.providers[n]; done {
			continue
		}
		f, err := r.factory(n)
		if err != nil {
			return nil, err
		}
		p, err := f()
		if err != nil {
			return nil, fmt.Errorf("kernels: provider %q: %w", n, err)
		}
		d.providers[n] = p
	}
	for dev := tensor.CPU; dev <= tensor.CUDA; dev++ {
		def := d.providers[dev.String()]
		for _, op := range Ops() {
			name := choice.Default
			if n, ok := choice.PerOp[op]; ok && d.providers[n].Device() == dev {
				name = n
			}
			p := d.providers[name]
			if p.Device() != dev {
				p = def
			}
			if p != nil && p != def && !p.Has(op) {
				log("kernels: provider lacks op, using the device default",
					"provider", p.Name(), "op", op.String(), "device", dev.String(), "fallback", dev.String())
				p = def
			}
			if p != nil && !p.Has(op) {
				p = nil
			}
			d.table[dev][op] = p
		}
	}
	return d, nil
}

// Choice returns the choice the dispatcher was built from.
func (d *Dispatcher) Choice() Choice { return d.choice }

// Provider returns the provider that serves op on dev, or nil.
func (d *Dispatcher) Provider(dev tensor.DeviceKind, op Op) Provider {
	if dev > tensor.CUDA || op >= numOps {
		return nil
	}
	return d.table[dev][op]
}

// Providers returns the names of the providers the dispatcher built, sorted.
func (d *Dispatcher) Providers() []string {
	names := make([]string, 0, len(d.providers))
	for n := range d.providers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func (d *Dispatcher) route(op Op, out *tensor.Tensor) (Provider, error) {
	if out == nil {
		return nil, fmt.Errorf("%w: %v: nil output", ErrShape, op)
	}
	dev := out.Device().Kind
	if p := d.Provider(dev, op); p != nil {
		return p, nil
	}
	return nil, fmt.Errorf("%w: %v on %v", ErrNoProvider, op, dev)
}

// Gemm implements Kernels.
func (d *Dispatcher) Gemm(p GemmParams, a, b, c *tensor.Tensor) error {
	k, err := d.route(OpGemm, c)
	if err != nil {
		return err
	}
	return k.Gemm(p, a, b, c)
}

// Gemv implements Kernels.
func (d *Dispatcher) Gemv(p GemvParams, a, x, y *tensor.Tensor) error {
	k, err := d.route(OpGemv, y)
	if err != nil {
		return err
	}
	return k.Gemv(p, a, x, y)
}

// LinearForward implements Kernels.
func (d *Dispatcher) LinearForward(y, x, w, b *tensor.Tensor) error {
	k, err := d.route(OpLinearForward, y)
	if err != nil {
		return err
	}
	return k.LinearForward(y, x, w, b)
}

// LinearBackwardInput implements Kernels.
func (d *Dispatcher) LinearBackwardInput(dx, dy, w *tensor.Tensor) error {
	k, err := d.route(OpLinearBackwardInput, dx)
	if err != nil {
		return err
	}
	return k.LinearBackwardInput(dx, dy, w)
}

// LinearBackwardWeight implements Kernels.
func (d *Dispatcher) LinearBackwardWeight(dw, dy, x *tensor.Tensor, accumulate bool) error {
	k, err := d.route(OpLinearBackwardWeight, dw)
	if err != nil {
		return err
	}
	return k.LinearBackwardWeight(dw, dy, x, accumulate)
}

// LinearBackwardBias implements Kernels.
func (d *Dispatcher) LinearBackwardBias(db, dy *tensor.Tensor, accumulate bool) error {
	k, err := d.route(OpLinearBackwardBias, db)
	if err != nil {
		return err
	}
	return k.LinearBackwardBias(db, dy, accumulate)
}

// MatmulForward implements Kernels.
func (d *Dispatcher) MatmulForward(c, a, b *tensor.Tensor) error {
	k, err := d.route(OpMatmulForward, c)
	if err != nil {
		return err
	}
	return k.MatmulForward(c, a, b)
}

// MatmulBackwardInput implements Kernels.
func (d *Dispatcher) MatmulBackwardInput(da, dc, b *tensor.Tensor, accumulate bool) error {
	k, err := d.route(OpMatmulBackwardInput, da)
	if err != nil {
		return err
	}
	return k.MatmulBackwardInput(da, dc, b, accumulate)
}

// MatmulBackwardOther implements Kernels.
func (d *Dispatcher) MatmulBackwardOther(db, dc, a *tensor.Tensor, accumulate bool) error {
	k, err := d.route(OpMatmulBackwardOther, db)
	if err != nil {
		return err
	}
	return k.MatmulBackwardOther(db, dc, a, accumulate)
}

// GeluForward implements Kernels.
func (d *Dispatcher) GeluForward(y, x *tensor.Tensor) error {
	k, err := d.route(OpGeluForward, y)
	if err != nil {
		return err
	}
	return k.GeluForward(y, x)
}

// GeluBackward implements Kernels.
func (d *Dispatcher) GeluBackward(dx, dy, x *tensor.Tensor) error {
	k, err := d.route(OpGeluBackward, dx)
	if err != nil {
		return err
	}
	return k.GeluBackward(dx, dy, x)
}

var _ Kernels = (*Dispatcher)(nil)
