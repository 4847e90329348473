package sim

import (
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/tensor"
)

// Name is the name the provider registers under.
const Name = "sim"

// Options configures a Provider; the zero value is the default.
type Options struct {
	// Ordinal numbers the simulated device (sim:N).
	Ordinal int
	// Threads caps the cpu kernels' goroutines per call (0: GOMAXPROCS).
	Threads int
}

// Provider runs the cpu kernels on sim device memory. Operands must be tensors
// of its Memory; host tensors are refused (kernels.ErrDevice), as a GPU
// provider refuses them.
type Provider struct {
	mem *Memory
	cpu *cpu.Provider
}

var _ kernels.MemoryProvider = (*Provider)(nil)

// New returns a provider with its own simulated device memory.
func New(o Options) (*Provider, error) {
	c, err := cpu.New(cpu.Options{Threads: o.Threads})
	if err != nil {
		return nil, err
	}
	return &Provider{mem: NewMemory(o.Ordinal), cpu: c}, nil
}

// Name implements kernels.Provider.
func (p *Provider) Name() string { return Name }

// Device implements kernels.Provider.
func (p *Provider) Device() tensor.DeviceKind { return tensor.Sim }

// Has implements kernels.Provider: every op the cpu provider has.
func (p *Provider) Has(op kernels.Op) bool { return p.cpu.Has(op) }

// DTypes implements kernels.Provider: the cpu provider's.
func (p *Provider) DTypes() []tensor.DType { return p.cpu.DTypes() }

// Cast implements kernels.Kernels.
func (p *Provider) Cast(dst, src *tensor.Tensor) error {
	v, err := p.views(dst, src)
	if err != nil {
		return err
	}
	return p.cpu.Cast(v[0], v[1])
}

// Memory implements kernels.MemoryProvider.
func (p *Provider) Memory() tensor.Memory { return p.mem }

// views maps device operands to host views (nil stays nil).
func (p *Provider) views(ts ...*tensor.Tensor) ([]*tensor.Tensor, error) {
	if err := kernels.SameDevice(tensor.Sim, ts...); err != nil {
		return nil, err
	}
	out := make([]*tensor.Tensor, len(ts))
	for i, t := range ts {
		v, err := p.mem.view(t)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// Gemm implements kernels.Kernels.
func (p *Provider) Gemm(g kernels.GemmParams, o kernels.GemmOperands) error {
	v, err := p.views(o.A, o.B, o.C, o.Bias, o.Aux)
	if err != nil {
		return err
	}
	return p.cpu.Gemm(g, kernels.GemmOperands{A: v[0], B: v[1], C: v[2], Bias: v[3], Aux: v[4]})
}

// GroupedGemm implements kernels.Kernels: the cpu provider's grouped GEMM on
// host views of the operands.
func (p *Provider) GroupedGemm(g kernels.GroupedParams, o kernels.GemmOperands) error {
	v, err := p.views(o.A, o.B, o.C, o.Bias, o.Aux)
	if err != nil {
		return err
	}
	return p.cpu.GroupedGemm(g, kernels.GemmOperands{A: v[0], B: v[1], C: v[2], Bias: v[3], Aux: v[4]})
}

// Gemv implements kernels.Kernels.
func (p *Provider) Gemv(g kernels.GemvParams, a, x, y *tensor.Tensor) error {
	v, err := p.views(a, x, y)
	if err != nil {
		return err
	}
	return p.cpu.Gemv(g, v[0], v[1], v[2])
}

// GeluForward implements kernels.Kernels.
func (p *Provider) GeluForward(y, x *tensor.Tensor) error {
	v, err := p.views(y, x)
	if err != nil {
		return err
	}
	return p.cpu.GeluForward(v[0], v[1])
}

// GeluBackward implements kernels.Kernels.
func (p *Provider) GeluBackward(dx, dy, x *tensor.Tensor) error {
	v, err := p.views(dx, dy, x)
	if err != nil {
		return err
	}
	return p.cpu.GeluBackward(v[0], v[1], v[2])
}

// BiasGrad implements kernels.Kernels.
func (p *Provider) BiasGrad(db, dy *tensor.Tensor, accumulate bool) error {
	v, err := p.views(db, dy)
	if err != nil {
		return err
	}
	return p.cpu.BiasGrad(v[0], v[1], accumulate)
}

// Axpy implements kernels.Kernels.
func (p *Provider) Axpy(alpha float64, x, y *tensor.Tensor) error {
	v, err := p.views(x, y)
	if err != nil {
		return err
	}
	return p.cpu.Axpy(alpha, v[0], v[1])
}

// MSE implements kernels.Kernels.
func (p *Provider) MSE(dy, sum, y, target *tensor.Tensor, scale float64) error {
	v, err := p.views(dy, sum, y, target)
	if err != nil {
		return err
	}
	return p.cpu.MSE(v[0], v[1], v[2], v[3], scale)
}

// LayerNorm implements kernels.Kernels.
func (p *Provider) LayerNorm(y, stats, x, gamma, beta *tensor.Tensor, eps float64) error {
	v, err := p.views(y, stats, x, gamma, beta)
	if err != nil {
		return err
	}
	return p.cpu.LayerNorm(v[0], v[1], v[2], v[3], v[4], eps)
}

// LayerNormBackward implements kernels.Kernels.
func (p *Provider) LayerNormBackward(dx, dgamma, dbeta, dy, x, gamma, stats *tensor.Tensor, accumulate bool) error {
	v, err := p.views(dx, dgamma, dbeta, dy, x, gamma, stats)
	if err != nil {
		return err
	}
	return p.cpu.LayerNormBackward(v[0], v[1], v[2], v[3], v[4], v[5], v[6], accumulate)
}

// Attention implements kernels.Kernels.
func (p *Provider) Attention(o, lse, q, k, vv *tensor.Tensor, causal bool) error {
	v, err := p.views(o, lse, q, k, vv)
	if err != nil {
		return err
	}
	return p.cpu.Attention(v[0], v[1], v[2], v[3], v[4], causal)
}

// AttentionBackward implements kernels.Kernels.
func (p *Provider) AttentionBackward(dq, dk, dv, do, q, k, vv, o, lse *tensor.Tensor, causal bool) error {
	v, err := p.views(dq, dk, dv, do, q, k, vv, o, lse)
	if err != nil {
		return err
	}
	return p.cpu.AttentionBackward(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], causal)
}

// Embedding implements kernels.Kernels.
func (p *Provider) Embedding(y, ids, table *tensor.Tensor, offset int) error {
	v, err := p.views(y, ids, table)
	if err != nil {
		return err
	}
	return p.cpu.Embedding(v[0], v[1], v[2], offset)
}

// EmbeddingBackward implements kernels.Kernels.
func (p *Provider) EmbeddingBackward(dtable, dy, ids *tensor.Tensor, offset int, accumulate bool) error {
	v, err := p.views(dtable, dy, ids)
	if err != nil {
		return err
	}
	return p.cpu.EmbeddingBackward(v[0], v[1], v[2], offset, accumulate)
}

// CrossEntropy implements kernels.Kernels.
func (p *Provider) CrossEntropy(stats, logits, targets *tensor.Tensor, offset int) error {
	v, err := p.views(stats, logits, targets)
	if err != nil {
		return err
	}
	return p.cpu.CrossEntropy(v[0], v[1], v[2], offset)
}

// CrossEntropyBackward implements kernels.Kernels.
func (p *Provider) CrossEntropyBackward(dlogits, logits, targets, lse *tensor.Tensor, offset int, scale float64) error {
	v, err := p.views(dlogits, logits, targets, lse)
	if err != nil {
		return err
	}
	return p.cpu.CrossEntropyBackward(v[0], v[1], v[2], v[3], offset, scale)
}

// CrossEntropyCombine implements kernels.Kernels.
func (p *Provider) CrossEntropyCombine(lse, loss, stats *tensor.Tensor) error {
	v, err := p.views(lse, loss, stats)
	if err != nil {
		return err
	}
	return p.cpu.CrossEntropyCombine(v[0], v[1], v[2])
}

// AdamW implements kernels.Kernels.
func (p *Provider) AdamW(a kernels.AdamWParams, param, grad, m, vv *tensor.Tensor) error {
	v, err := p.views(param, grad, m, vv)
	if err != nil {
		return err
	}
	return p.cpu.AdamW(a, v[0], v[1], v[2], v[3])
}
