package kernels

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

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

// Factory returns the factory registered under name.
func (r *Registry) Factory(name string) (Factory, error) { return r.factory(name) }

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
// single ops. Every provider named must run on Default's device; an op a chosen
// provider lacks runs on the device's default provider (the one named like the
// device: "cpu", "sim", "cuda").
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

// Names returns the provider names the choice mentions, Default first.
func (c Choice) Names() []string {
	names := []string{c.Default}
	for _, op := range Ops() {
		if n, ok := c.PerOp[op]; ok && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}

// Logger receives structured log lines; (*zap.SugaredLogger).Infow fits, and so
// does a no-op func.
type Logger func(msg string, keysAndValues ...any)

// route is the provider that serves an op, and why it was picked.
type route struct {
	p   Provider
	why string
}

// Dispatcher is one rank's device: it routes each op to one provider, fixed
// when it is built, and allocates and copies tensors in the device's memory
// (it implements Compute). An op on a tensor of another device is an error, never
// a silent detour. The first call of each op is logged with the provider that
// ran it and why. It is safe for concurrent use if its providers are.
type Dispatcher struct {
	tensor.Memory
	dev       tensor.DeviceKind
	table     [numOps]route
	providers map[string]Provider
	choice    Choice
	log       Logger
	logged    [numOps]atomic.Bool
}

var _ Compute = (*Dispatcher)(nil)

// NewDispatcher builds the providers named in choice and the default provider
// of their device, and fixes the route of every op. An unknown name, or
// providers of different devices, is an error.
func (r *Registry) NewDispatcher(choice Choice, log Logger) (*Dispatcher, error) {
	if log == nil {
		log = func(string, ...any) {}
	}
	if choice.Default == "" {
		choice.Default = "cpu"
	}
	d := &Dispatcher{providers: map[string]Provider{}, choice: choice, log: log}
	build := func(n string) (Provider, error) {
		if p, ok := d.providers[n]; ok {
			return p, nil
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
		return p, nil
	}
	first, err := build(choice.Default)
	if err != nil {
		return nil, err
	}
	d.dev = first.Device()
	def, err := build(d.dev.String())
	if err != nil {
		return nil, fmt.Errorf("%w (%q runs on %v, whose default provider is missing)", err, choice.Default, d.dev)
	}
	mp, ok := def.(MemoryProvider)
	if !ok {
		return nil, fmt.Errorf("kernels: provider %q owns no %v memory", def.Name(), d.dev)
	}
	d.Memory = mp.Memory()
	for _, n := range choice.Names()[1:] {
		p, err := build(n)
		if err != nil {
			return nil, err
		}
		if p.Device() != d.dev {
			return nil, fmt.Errorf("%w: provider %q runs on %v, the rank's kernels (%q) on %v", ErrDevice, n, p.Device(), choice.Default, d.dev)
		}
	}
	for _, op := range Ops() {
		name, why := choice.Default, "chosen"
		if n, ok := choice.PerOp[op]; ok {
			name, why = n, "chosen for this op"
		}
		p := d.providers[name]
		if !p.Has(op) {
			why = fmt.Sprintf("fallback: %s lacks %v", p.Name(), op)
			p = def
		}
		if !p.Has(op) {
			p, why = nil, fmt.Sprintf("no %v provider has %v", d.dev, op)
		}
		d.table[op] = route{p, why}
	}
	return d, nil
}

// DeviceMemory is the memory of the device's own provider (see the
// package's DeviceMemory).
func (d *Dispatcher) DeviceMemory() tensor.Memory { return d.Memory }

// Choice returns the choice the dispatcher was built from.
func (d *Dispatcher) Choice() Choice { return d.choice }

// DeviceKind is the kind of device the dispatcher computes on.
func (d *Dispatcher) DeviceKind() tensor.DeviceKind { return d.dev }

// Provider returns the provider that serves op, or nil.
func (d *Dispatcher) Provider(op Op) Provider {
	if op >= numOps {
		return nil
	}
	return d.table[op].p
}

// Has reports whether some provider serves op.
func (d *Dispatcher) Has(op Op) bool { return d.Provider(op) != nil }

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
	if op >= numOps {
		return nil, fmt.Errorf("%w: %v", ErrUnknownOp, op)
	}
	if dev := out.Device().Kind; dev != d.dev {
		return nil, fmt.Errorf("%w: %v on %v, but this rank computes on %v", ErrDevice, op, out, d.dev)
	}
	r := d.table[op]
	if !d.logged[op].Load() && d.logged[op].CompareAndSwap(false, true) {
		name := "none"
		if r.p != nil {
			name = r.p.Name()
		}
		d.log("kernels: op runs on provider", "op", op.String(), "provider", name, "device", d.dev.String(), "why", r.why)
	}
	if r.p == nil {
		return nil, fmt.Errorf("%w: %v on %v (%s)", ErrNoProvider, op, d.dev, r.why)
	}
	return r.p, nil
}

// Gemm implements Kernels.
func (d *Dispatcher) Gemm(p GemmParams, o GemmOperands) error {
	k, err := d.route(p.Epilogue.Op(), o.C)
	if err != nil {
		return err
	}
	return k.Gemm(p, o)
}

// GroupedGemm implements Kernels.
func (d *Dispatcher) GroupedGemm(p GroupedParams, o GemmOperands) error {
	k, err := d.route(OpGroupedGemm, o.C)
	if err != nil {
		return err
	}
	return k.GroupedGemm(p, o)
}

// Gemv implements Kernels.
func (d *Dispatcher) Gemv(p GemvParams, a, x, y *tensor.Tensor) error {
	k, err := d.route(OpGemv, y)
	if err != nil {
		return err
	}
	return k.Gemv(p, a, x, y)
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

// BiasGrad implements Kernels.
func (d *Dispatcher) BiasGrad(db, dy *tensor.Tensor, accumulate bool) error {
	k, err := d.route(OpBiasGrad, db)
	if err != nil {
		return err
	}
	return k.BiasGrad(db, dy, accumulate)
}

// Axpy implements Kernels.
func (d *Dispatcher) Axpy(alpha float64, x, y *tensor.Tensor) error {
	k, err := d.route(OpAxpy, y)
	if err != nil {
		return err
	}
	return k.Axpy(alpha, x, y)
}

// Cast implements Kernels.
func (d *Dispatcher) Cast(dst, src *tensor.Tensor) error {
	k, err := d.route(OpCast, dst)
	if err != nil {
		return err
	}
	return k.Cast(dst, src)
}

// MSE implements Kernels.
func (d *Dispatcher) MSE(dy, sum, y, target *tensor.Tensor, scale float64) error {
	k, err := d.route(OpMSE, dy)
	if err != nil {
		return err
	}
	return k.MSE(dy, sum, y, target, scale)
}

// firstOf is the first non-nil tensor: the output an op with optional
// outputs is routed by.
func firstOf(ts ...*tensor.Tensor) *tensor.Tensor {
	for _, t := range ts {
		if t != nil {
			return t
		}
	}
	return nil
}

// LayerNorm implements Kernels.
func (d *Dispatcher) LayerNorm(y, stats, x, gamma, beta *tensor.Tensor, eps float64) error {
	k, err := d.route(OpLayerNorm, y)
	if err != nil {
		return err
	}
	return k.LayerNorm(y, stats, x, gamma, beta, eps)
}

// LayerNormBackward implements Kernels.
func (d *Dispatcher) LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats *tensor.Tensor, accumulate bool) error {
	k, err := d.route(OpLayerNormBackward, firstOf(dx, dgamma, dbeta))
	if err != nil {
		return err
	}
	return k.LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats, accumulate)
}

// Attention implements Kernels.
func (d *Dispatcher) Attention(o, lse, q, kk, v *tensor.Tensor, causal bool) error {
	k, err := d.route(OpAttention, o)
	if err != nil {
		return err
	}
	return k.Attention(o, lse, q, kk, v, causal)
}

// AttentionBackward implements Kernels.
func (d *Dispatcher) AttentionBackward(dq, dk, dv, do, q, kk, v, o, lse *tensor.Tensor, causal bool) error {
	k, err := d.route(OpAttentionBackward, dq)
	if err != nil {
		return err
	}
	return k.AttentionBackward(dq, dk, dv, do, q, kk, v, o, lse, causal)
}

// Embedding implements Kernels.
func (d *Dispatcher) Embedding(y, ids, table *tensor.Tensor, offset int) error {
	k, err := d.route(OpEmbedding, y)
	if err != nil {
		return err
	}
	return k.Embedding(y, ids, table, offset)
}

// EmbeddingBackward implements Kernels.
func (d *Dispatcher) EmbeddingBackward(dtable, dy, ids *tensor.Tensor, offset int, accumulate bool) error {
	k, err := d.route(OpEmbeddingBackward, dtable)
	if err != nil {
		return err
	}
	return k.EmbeddingBackward(dtable, dy, ids, offset, accumulate)
}

// CrossEntropy implements Kernels.
func (d *Dispatcher) CrossEntropy(stats, logits, targets *tensor.Tensor, offset int) error {
	k, err := d.route(OpCrossEntropy, stats)
	if err != nil {
		return err
	}
	return k.CrossEntropy(stats, logits, targets, offset)
}

// CrossEntropyBackward implements Kernels.
func (d *Dispatcher) CrossEntropyBackward(dlogits, logits, targets, lse *tensor.Tensor, offset int, scale float64) error {
	k, err := d.route(OpCrossEntropyBackward, dlogits)
	if err != nil {
		return err
	}
	return k.CrossEntropyBackward(dlogits, logits, targets, lse, offset, scale)
}

// CrossEntropyCombine implements Kernels.
func (d *Dispatcher) CrossEntropyCombine(lse, loss, stats *tensor.Tensor) error {
	k, err := d.route(OpCrossEntropyCombine, lse)
	if err != nil {
		return err
	}
	return k.CrossEntropyCombine(lse, loss, stats)
}

// AdamW implements Kernels.
func (d *Dispatcher) AdamW(p AdamWParams, param, grad, m, v *tensor.Tensor) error {
	k, err := d.route(OpAdamW, param)
	if err != nil {
		return err
	}
	return k.AdamW(p, param, grad, m, v)
}
