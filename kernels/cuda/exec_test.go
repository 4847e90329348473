package cuda

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/kernels/kerneltest"
	"github.com/meshrun/meshrun/kernels/sim"
	"github.com/meshrun/meshrun/tensor"
)

// simDevice is a planDevice on the sim device: the cpu kernels on views of
// sim memory stand in for cuBLAS and the PTX kernels (whose own arithmetic
// the ptx package's emulation tests), so that the plans' composition (what
// is cast where, in which dtype, at which leading dimension, in which
// order) runs against the conformance suite without a GPU.
type simDevice struct {
	t       *testing.T
	mem     tensor.Memory
	cpu     *cpu.Provider
	ones    map[tensor.DType]*tensor.Tensor
	scratch [numSlots]*tensor.Tensor
}

func (d *simDevice) addr(t *tensor.Tensor) uint64 {
	return uint64(t.Buffer().(interface{ Addr() uintptr }).Addr())
}

// view is a host tensor over n elements of dtype dt at address a.
func (d *simDevice) view(a uint64, dt tensor.DType, n int) *tensor.Tensor {
	b, err := sim.Resolve(uintptr(a), n*dt.Size())
	if err != nil {
		d.t.Fatalf("plan step outside device memory: %v", err)
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	var t *tensor.Tensor
	switch dt {
	case tensor.Float32:
		t, err = tensor.FromFloat32(unsafe.Slice((*float32)(p), n), n)
	case tensor.Float64:
		t, err = tensor.FromFloat64(unsafe.Slice((*float64)(p), n), n)
	default:
		t, err = tensor.FromBFloat16(unsafe.Slice((*tensor.BF16)(p), n), n)
	}
	if err != nil {
		d.t.Fatal(err)
	}
	return t
}

func (d *simDevice) gemm(g kernels.GemmParams, a, b, c uint64) error {
	if g.M == 0 || g.N == 0 || g.K == 0 {
		return fmt.Errorf("an empty GEMM %dx%dx%d reached the library", g.M, g.N, g.K)
	}
	la, lb, lc := g.Lens()
	return d.cpu.Gemm(g, kernels.GemmOperands{A: d.view(a, g.DType, la), B: d.view(b, g.DType, lb), C: d.view(c, g.Out(), lc)})
}

func (d *simDevice) copy2D(dst uint64, dstPitch int, src uint64, srcPitch, width, rows int) error {
	if rows == 0 || width == 0 {
		return nil
	}
	span := func(pitch int) int { return (rows-1)*pitch + width }
	if rows == 1 {
		dstPitch, srcPitch = width, width
	}
	db, err := sim.Resolve(uintptr(dst), span(dstPitch))
	if err != nil {
		return err
	}
	sb, err := sim.Resolve(uintptr(src), span(srcPitch))
	if err != nil {
		return err
	}
	tensor.Copy2DBytes(db, 0, dstPitch, sb, 0, srcPitch, width, rows)
	return nil
}

func (d *simDevice) launch(name string, n, blocks, threads int, args ...uint64) error {
	switch name {
	case "cast_f32_bf16":
		return d.cpu.Cast(d.view(args[0], tensor.BFloat16, n), d.view(args[1], tensor.Float32, n))
	case "cast_bf16_f32":
		return d.cpu.Cast(d.view(args[0], tensor.Float32, n), d.view(args[1], tensor.BFloat16, n))
	case "gelu_f32", "gelu_f64":
		dt := map[string]tensor.DType{"gelu_f32": tensor.Float32, "gelu_f64": tensor.Float64}[name]
		return d.cpu.GeluForward(d.view(args[0], dt, n), d.view(args[1], dt, n))
	case "gelu_grad_f32", "gelu_grad_f64":
		dt := map[string]tensor.DType{"gelu_grad_f32": tensor.Float32, "gelu_grad_f64": tensor.Float64}[name]
		return d.cpu.GeluBackward(d.view(args[0], dt, n), d.view(args[1], dt, n), d.view(args[2], dt, n))
	}
	return fmt.Errorf("a GEMM plan launched kernel %s, which it does not use", name)
}

func (d *simDevice) onesVec(dt tensor.DType, n int) (uint64, error) {
	if o := d.ones[dt]; o == nil || o.Len() < n {
		t, err := tensor.Upload(d.mem, kernels.Ones(dt, max(n, 1)))
		if err != nil {
			return 0, err
		}
		d.ones[dt] = t
	}
	return d.addr(d.ones[dt]), nil
}

func (d *simDevice) scratchBuf(slot, n int) (uint64, error) {
	if s := d.scratch[slot]; s == nil || s.Bytes() < n {
		t, err := d.mem.Alloc(tensor.Float64, (max(n, 1)+7)/8)
		if err != nil {
			return 0, err
		}
		d.scratch[slot] = t
	}
	return d.addr(d.scratch[slot]), nil
}

// planKernels is the sim provider whose GEMMs run as the cuda provider's
// plans with cuBLASLt refusing every GEMM: the fallback of each.
type planKernels struct {
	*sim.Provider
	dev *simDevice
}

func (k *planKernels) Gemm(g kernels.GemmParams, o kernels.GemmOperands) error {
	g, err := kernels.CheckGemm(g, o)
	if err != nil {
		return err
	}
	if empty, err := kernels.EmptyGemm(k, k.Memory(), g, o); empty {
		return err
	}
	pl := planGemm(g)
	if pl.refused() {
		return fmt.Errorf("%w: %s", kernels.ErrUnsupported, pl.describe(g, true))
	}
	return runPlan(k.dev, g, pl, o)
}

// TestPlansConform runs the conformance suite on the plans cuBLASLt's
// refusals leave (every GEMM, every epilogue, dtype and layout of the
// suite), their steps on the sim device.
func TestPlansConform(t *testing.T) {
	sp, err := sim.New(sim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	host, err := cpu.New(cpu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	k := &planKernels{Provider: sp, dev: &simDevice{t: t, mem: sp.Memory(), cpu: host, ones: map[tensor.DType]*tensor.Tensor{}}}
	kerneltest.Run(t, kerneltest.Config{
		New:    func(int) (kernels.Kernels, error) { return k, nil },
		Memory: sp.Memory(),
		DTypes: providerDTypes,
	})
}
