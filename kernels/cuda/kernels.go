//go:build cuda

package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/meshrun/meshrun/kernels/cuda/ptx"
	"github.com/meshrun/meshrun/tensor"
)

// elementwise is the loaded module (ptx.PTX), its functions, and the MSE's partial sums.
type elementwise struct {
	mod  cu.Module
	fns  map[string]cu.Function
	part cu.DevicePtr // ptx.MSEThreads float64s and each ptx.SumStages stage's
}

// kernel returns the named function of the module, loading it on first use
// (inside do).
func (p *Provider) kernel(name string) (cu.Function, error) {
	if p.ew == nil {
		mod, err := cu.LoadData(ptx.PTX)
		if err != nil {
			return cu.Function{}, fmt.Errorf("cuda: loading the kernels' PTX: %w", err)
		}
		n := ptx.MSEThreads
		for _, s := range ptx.SumStages(ptx.MSEThreads) {
			n += s
		}
		part, err := cu.MemAlloc(int64(n * 8))
		if err != nil {
			mod.Unload()
			return cu.Function{}, fmt.Errorf("cuda: MSE partial sums: %w", err)
		}
		p.ew = &elementwise{mod: mod, fns: map[string]cu.Function{}, part: part}
	}
	if fn, ok := p.ew.fns[name]; ok {
		return fn, nil
	}
	fn, err := p.ew.mod.Function(name)
	if err != nil {
		return cu.Function{}, fmt.Errorf("cuda: kernel %s: %w", name, err)
	}
	p.ew.fns[name] = fn
	return fn, nil
}

// closeElementwise releases the module and the partial sums (inside the
// context).
func (p *Provider) closeElementwise() error {
	if p.ew == nil {
		return nil
	}
	err := cu.MemFree(p.ew.part)
	if e := p.ew.mod.Unload(); err == nil {
		err = e
	}
	p.ew = nil
	return err
}

// launch queues kernel name on blocks×ptx.BlockThreads threads (blocks 0:
// enough for n elements, at most 4096 blocks: the loops are grid-stride) on
// the provider's stream. Every argument is 8 bytes (a device address, a count, or a
// float's bits in the low bytes), as cu's Launch copies them.
func (p *Provider) launch(name string, n, blocks, threads int, args ...uint64) error {
	fn, err := p.kernel(name)
	if err != nil {
		return err
	}
	if blocks == 0 {
		blocks = min(max(1, (n+ptx.BlockThreads-1)/ptx.BlockThreads), 4096)
	}
	params := make([]unsafe.Pointer, len(args))
	for i := range args {
		params[i] = unsafe.Pointer(&args[i])
	}
	if err := fn.Launch(blocks, 1, 1, threads, 1, 1, 0, p.stream, params); err != nil {
		return fmt.Errorf("cuda: kernel %s: %w", name, err)
	}
	return nil
}

// scalar is a kernel's float argument: float64 bits for the float64
// variants, float32 bits otherwise.
func scalar(dt tensor.DType, v float64) uint64 {
	if dt == tensor.Float64 {
		return math.Float64bits(v)
	}
	return uint64(math.Float32bits(float32(v)))
}

// gelu runs y = gelu(x) (dy nil) or y = dy·gelu'(x).
func (p *Provider) gelu(y, dy, x *tensor.Tensor) error {
	n := x.Len()
	if n == 0 {
		return nil
	}
	return p.do(func() error {
		if dy == nil {
			return p.launch("gelu"+suffix(x.DType()), n, 0, ptx.BlockThreads, dev(y), dev(x), uint64(n))
		}
		return p.launch("gelu_grad"+suffix(x.DType()), n, 0, ptx.BlockThreads, dev(y), dev(dy), dev(x), uint64(n))
	})
}

// mse runs the mean squared error and its fixed-order sum: ptx.MSEThreads
// partial sums, then the stages of ptx.SumStages, the last into sum[0].
func (p *Provider) mse(dy, sum, y, target *tensor.Tensor, scale float64) error {
	n, dt := y.Len(), y.DType()
	return p.do(func() error {
		if _, err := p.kernel("sum_stage"); err != nil {
			return err
		}
		part := uint64(p.ew.part)
		if err := p.launch("mse"+suffix(dt), n, ptx.MSEThreads/ptx.BlockThreads, ptx.BlockThreads,
			dev(dy), part, dev(y), dev(target), scalar(dt, scale), uint64(n)); err != nil {
			return err
		}
		in, count := part, ptx.MSEThreads
		stages := ptx.SumStages(ptx.MSEThreads)
		for i, threads := range stages {
			out := in + uint64(count*8)
			if i == len(stages)-1 {
				out = dev(sum)
			}
			blocks, block := 1, threads
			if threads > ptx.BlockThreads {
				blocks, block = threads/ptx.BlockThreads, ptx.BlockThreads
			}
			if err := p.launch("sum_stage", threads, blocks, block, out, in, uint64(count)); err != nil {
				return err
			}
			in, count = out, threads
		}
		return nil
	})
}
