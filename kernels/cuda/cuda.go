//go:build cuda

package cuda

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"gonum.org/v1/gonum/blas"
	"gorgonia.org/cu"
	cublas "gorgonia.org/cu/blas"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/tensor"
)

// Name is the name the provider registers under.
const Name = "cuda"

// ErrNoDevice reports that no CUDA device is visible.
var ErrNoDevice = errors.New("cuda: no device")

// Buffer is device memory allocated by a Provider's Memory; it implements
// tensor.Buffer.
type Buffer struct {
	ptr cu.DevicePtr
	n   int
	mem *Memory
}

// Memory implements tensor.Buffer.
func (b *Buffer) Memory() tensor.Memory { return b.mem }

// Len implements tensor.Buffer.
func (b *Buffer) Len() int { return b.n }

// Ptr returns the device address.
func (b *Buffer) Ptr() cu.DevicePtr { return b.ptr }

// Addr returns the device address as a number (what a collective library
// such as NCCL takes).
func (b *Buffer) Addr() uintptr { return uintptr(b.ptr) }

// Provider runs ops on one GPU. Every call binds the provider's context to the
// calling OS thread for its duration; its work is queued on the context's
// default stream, in call order, and copies to the host wait for it (see do).
// Calls are serialized.
//
// GEMMs run on cuBLASLt with their epilogues fused (cuBLAS for float64 and
// batches), the elementwise ops as the PTX kernels of ptx/kernels.h; the
// transformer's ops (layer norm, attention, embedding, cross-entropy, AdamW)
// still run on the host, their copies counted as transfers.
type Provider struct {
	mu      sync.Mutex
	ordinal int
	ctx     cu.CUContext
	blas    *cublas.Standard
	ones    *Buffer // a device vector of 1s (float32), grown on demand
	ones64  *Buffer
	host    *cpu.Provider // float64 data of the non-GEMM ops runs on the host
	mem     *Memory
	lt      *lt          // cuBLASLt (made on first use)
	ew      *elementwise // the kernels of ptx/kernels.h (loaded on first use)
}

var _ kernels.MemoryProvider = (*Provider)(nil)

// New opens device ordinal (as numbered under CUDA_VISIBLE_DEVICES).
func New(ordinal int) (p *Provider, err error) {
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDevice, err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("%w: ordinal %d of %d devices", ErrNoDevice, ordinal, n)
	}
	dev, err := cu.GetDevice(ordinal)
	if err != nil {
		return nil, err
	}
	ctx, err := dev.MakeContext(cu.SchedAuto)
	if err != nil {
		return nil, fmt.Errorf("cuda: context on device %d: %w", ordinal, err)
	}
	host, err := cpu.New(cpu.Options{})
	if err != nil {
		return nil, err
	}
	p = &Provider{ordinal: ordinal, ctx: ctx, host: host}
	p.mem = &Memory{p: p}
	err = p.do(func() error {
		var e error
		func() {
			defer func() {
				if r := recover(); r != nil {
					e = fmt.Errorf("cuda: cublas handle: %v", r)
				}
			}()
			p.blas = cublas.New()
		}()
		return e
	})
	if err != nil {
		ctx.Destroy()
		return nil, err
	}
	return p, nil
}

// Close releases the cuBLAS handle, the helper buffers and the context.
func (p *Provider) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.ctx.Lock(); err != nil {
		return err
	}
	var errs []error
	for _, b := range []*Buffer{p.ones, p.ones64} {
		if b != nil {
			errs = append(errs, cu.MemFree(b.ptr))
		}
	}
	errs = append(errs, p.closeLt(), p.closeElementwise(), p.blas.Close())
	errs = append(errs, p.ctx.Unlock(), p.ctx.Destroy())
	return errors.Join(errs...)
}

// do runs f with the context current on a locked OS thread, serialized with
// the provider's other calls. The work f enqueues runs on the context's
// default stream, in order with everything before and after it (kernels,
// cuBLAS, NCCL, copies); do does not wait for it: a copy to the host does
// (cuMemcpyDtoH), as a step's loss does. With MESHRUN_CUDA_SYNC=1 every op
// waits for its work, so that an error surfaces at the op that caused it.
func (p *Provider) do(f func() error) error { return p.on(f, syncEach) }

// on runs f with the context current, waiting for its work if wait.
func (p *Provider) on(f func() error, wait bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.SetCurrentContext(p.ctx); err != nil {
		return fmt.Errorf("cuda: set context: %w", err)
	}
	err := f()
	if wait && err == nil {
		if err = cu.Synchronize(); err != nil {
			err = fmt.Errorf("cuda: synchronize: %w", err)
		}
	}
	return err
}

// Synchronize waits for all the work queued so far.
func (p *Provider) Synchronize() error { return p.on(cu.Synchronize, false) }

// EnvSync makes every op wait for its work when "1" (see do).
const EnvSync = "MESHRUN_CUDA_SYNC"

var syncEach = os.Getenv(EnvSync) == "1"

// Run is do for a library that enqueues work on the context's default
// stream and polls for it (NCCL): f runs with the context current on a
// locked OS thread, serialized with the provider's ops, never waiting.
func (m *Memory) Run(f func() error) error { return m.p.on(f, false) }

// Memory implements kernels.MemoryProvider.
func (p *Provider) Memory() tensor.Memory { return p.mem }

// Memory is the GPU's memory (tensor.Memory).
type Memory struct {
	p     *Provider
	meter tensor.Meter
}

// Device implements tensor.Memory.
func (m *Memory) Device() tensor.Device {
	return tensor.Device{Kind: tensor.CUDA, Ordinal: m.p.ordinal}
}

// Alloc implements tensor.Memory: zeroed device memory.
func (m *Memory) Alloc(dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	n := tensor.NumElements(shape) * dt.Size()
	b := &Buffer{n: n, mem: m}
	if n > 0 {
		err := m.p.do(func() (err error) {
			if b.ptr, err = cu.MemAlloc(int64(n)); err != nil {
				return err
			}
			return cu.MemsetD8(b.ptr, 0, int64(n))
		})
		if err != nil {
			return nil, fmt.Errorf("cuda: alloc %d bytes: %w", n, err)
		}
	}
	return tensor.OnDevice(b, dt, shape...)
}

// buffer returns t's buffer, checking it is live memory of m.
func (m *Memory) buffer(t *tensor.Tensor) (*Buffer, error) {
	b, ok := t.Buffer().(*Buffer)
	if !ok || b.mem != m {
		return nil, fmt.Errorf("%w: %v is not memory of %v", tensor.ErrDevice, t, m.Device())
	}
	if b.n > 0 && b.ptr == 0 {
		return nil, fmt.Errorf("%w: %v used after Free", tensor.ErrDevice, t)
	}
	return b, nil
}

// Free implements tensor.Memory.
func (m *Memory) Free(t *tensor.Tensor) error {
	b, err := m.buffer(t)
	if err != nil || b.n == 0 {
		return err
	}
	err = m.p.do(func() error { return cu.MemFree(b.ptr) })
	b.ptr = 0
	return err
}

// Read implements tensor.Memory.
func (m *Memory) Read(p []byte, src *tensor.Tensor, off int, why tensor.Purpose) error {
	b, err := m.buffer(src)
	if err != nil {
		return err
	}
	if err := tensor.CheckRange(src, off, len(p)); err != nil || len(p) == 0 {
		return err
	}
	m.meter.Add(why, false, len(p))
	return m.p.do(func() error {
		return cu.MemcpyDtoH(unsafe.Pointer(unsafe.SliceData(p)), b.ptr+cu.DevicePtr(off), int64(len(p)))
	})
}

// Write implements tensor.Memory.
func (m *Memory) Write(dst *tensor.Tensor, off int, p []byte, why tensor.Purpose) error {
	b, err := m.buffer(dst)
	if err != nil {
		return err
	}
	if err := tensor.CheckRange(dst, off, len(p)); err != nil || len(p) == 0 {
		return err
	}
	m.meter.Add(why, true, len(p))
	return m.p.do(func() error {
		return cu.MemcpyHtoD(b.ptr+cu.DevicePtr(off), unsafe.Pointer(unsafe.SliceData(p)), int64(len(p)))
	})
}

// Copy2D implements tensor.Memory with cuMemcpy2D, device to device.
func (m *Memory) Copy2D(dst *tensor.Tensor, dstOff, dstPitch int, src *tensor.Tensor, srcOff, srcPitch, width, rows int) error {
	d, err := m.buffer(dst)
	if err != nil {
		return err
	}
	s, err := m.buffer(src)
	if err != nil {
		return err
	}
	if err := tensor.CheckCopy2D(dst, dstOff, dstPitch, src, srcOff, srcPitch, width, rows); err != nil {
		return err
	}
	if width == 0 || rows == 0 {
		return nil
	}
	return m.p.do(func() error {
		if rows == 1 {
			return cu.MemcpyDtoD(d.ptr+cu.DevicePtr(dstOff), s.ptr+cu.DevicePtr(srcOff), int64(width))
		}
		return cu.Memcpy2D(cu.Memcpy2dParam{
			Height: int64(rows), WidthInBytes: int64(width),
			DstDevice: d.ptr + cu.DevicePtr(dstOff), DstMemoryType: cu.DeviceMemory, DstPitch: int64(dstPitch),
			SrcDevice: s.ptr + cu.DevicePtr(srcOff), SrcMemoryType: cu.DeviceMemory, SrcPitch: int64(srcPitch),
		})
	})
}

// Zero implements tensor.Memory.
func (m *Memory) Zero(dst *tensor.Tensor, off, n int) error {
	b, err := m.buffer(dst)
	if err != nil {
		return err
	}
	if err := tensor.CheckRange(dst, off, n); err != nil || n == 0 {
		return err
	}
	return m.p.do(func() error { return cu.MemsetD8(b.ptr+cu.DevicePtr(off), 0, int64(n)) })
}

// Transfers implements tensor.Memory.
func (m *Memory) Transfers() tensor.Transfers { return m.meter.Transfers() }

// toHost copies device tensor d into a new host tensor (inside no do; counted).
func (p *Provider) toHost(d *tensor.Tensor) (*tensor.Tensor, error) { return tensor.Download(d) }

// fromHost copies host tensor h into device tensor d (counted).
func (p *Provider) fromHost(d, h *tensor.Tensor) error {
	return p.mem.Write(d, 0, tensor.HostBytes(h), tensor.Transfer)
}

// Name implements kernels.Provider.
func (p *Provider) Name() string { return Name }

// Device implements kernels.Provider.
func (p *Provider) Device() tensor.DeviceKind { return tensor.CUDA }

// Has implements kernels.Provider: every op (what cuBLASLt refuses runs on
// cuBLAS and the kernels; float64 data of the non-GEMM ops on the host).
func (p *Provider) Has(op kernels.Op) bool {
	return true
}

// devSlice views device memory as a Go slice header for cu/blas, which takes
// slices and passes &s[0] to cuBLAS. The slice must never be dereferenced in Go.
func devSlice[T float32 | float64](t *tensor.Tensor) []T {
	b := t.Buffer().(*Buffer)
	ptr := b.ptr
	return unsafe.Slice(*(**T)(unsafe.Pointer(&ptr)), t.Len())
}

func trans(t bool) blas.Transpose {
	if t {
		return blas.Trans
	}
	return blas.NoTrans
}

func (p *Provider) onDevice(ts ...*tensor.Tensor) error {
	return kernels.SameDevice(tensor.CUDA, ts...)
}

// gemm runs a checked row-major GEMM (must be called inside do).
func (p *Provider) gemm(g kernels.GemmParams, a, b, c *tensor.Tensor) error {
	if g.M == 0 || g.N == 0 {
		return nil
	}
	lda, ldb := g.LDA, g.LDB
	for i := 0; i < g.BatchCount; i++ {
		// Column-major Cᵀ[N×M] = op(B)ᵀ[N×K] · op(A)ᵀ[K×M].
		if g.DType == tensor.Float32 {
			av, bv, cv := devSlice[float32](a), devSlice[float32](b), devSlice[float32](c)
			p.blas.Sgemm(trans(g.TransB), trans(g.TransA), g.N, g.M, g.K, float32(g.Alpha),
				bv[i*g.StrideB:], ldb, av[i*g.StrideA:], lda, float32(g.Beta), cv[i*g.StrideC:], g.LDC)
		} else {
			av, bv, cv := devSlice[float64](a), devSlice[float64](b), devSlice[float64](c)
			p.blas.Dgemm(trans(g.TransB), trans(g.TransA), g.N, g.M, g.K, g.Alpha,
				bv[i*g.StrideB:], ldb, av[i*g.StrideA:], lda, g.Beta, cv[i*g.StrideC:], g.LDC)
		}
		if err := p.blas.Err(); err != nil {
			return fmt.Errorf("cuda: gemm: %w", err)
		}
	}
	return nil
}

// gemv runs a checked row-major GEMV (inside do): the row-major M×N matrix is the
// column-major N×M matrix Aᵀ, so the transpose flag flips.
func (p *Provider) gemv(g kernels.GemvParams, a, x, y *tensor.Tensor) error {
	_, lx, ly := g.Lens()
	if ly == 0 {
		return nil
	}
	if lx == 0 {
		return p.scale(y, ly, g.Beta)
	}
	t := trans(!g.Trans)
	if g.DType == tensor.Float32 {
		p.blas.Sgemv(t, g.N, g.M, float32(g.Alpha), devSlice[float32](a), g.LDA, devSlice[float32](x), 1,
			float32(g.Beta), devSlice[float32](y), 1)
	} else {
		p.blas.Dgemv(t, g.N, g.M, g.Alpha, devSlice[float64](a), g.LDA, devSlice[float64](x), 1,
			g.Beta, devSlice[float64](y), 1)
	}
	if err := p.blas.Err(); err != nil {
		return fmt.Errorf("cuda: gemv: %w", err)
	}
	return nil
}

// scale sets y[:n] = beta·y[:n] (0 without reading it when beta is 0).
func (p *Provider) scale(y *tensor.Tensor, n int, beta float64) error {
	b := y.Buffer().(*Buffer)
	if beta == 0 {
		return cu.MemsetD8(b.ptr, 0, int64(n*y.DType().Size()))
	}
	if y.DType() == tensor.Float32 {
		p.blas.Sscal(n, float32(beta), devSlice[float32](y), 1)
	} else {
		p.blas.Dscal(n, beta, devSlice[float64](y), 1)
	}
	return p.blas.Err()
}

// onesVec returns a device tensor of n ones (inside do).
func (p *Provider) onesVec(dt tensor.DType, n int) (*tensor.Tensor, error) {
	slot := &p.ones
	if dt == tensor.Float64 {
		slot = &p.ones64
	}
	if *slot == nil || (*slot).n < n*dt.Size() {
		if *slot != nil {
			cu.MemFree((*slot).ptr)
			*slot = nil
		}
		size := max(n, 1024) * dt.Size()
		ptr, err := cu.MemAlloc(int64(size))
		if err != nil {
			return nil, err
		}
		h := tensor.New(dt, size/dt.Size())
		for i := 0; i < h.Len(); i++ {
			if dt == tensor.Float32 {
				h.Float32()[i] = 1
			} else {
				h.Float64()[i] = 1
			}
		}
		if err := cu.MemcpyHtoD(ptr, unsafe.Pointer(unsafe.SliceData(tensor.HostBytes(h))), int64(size)); err != nil {
			cu.MemFree(ptr)
			return nil, err
		}
		*slot = &Buffer{ptr: ptr, n: size, mem: p.mem}
	}
	return tensor.OnDevice(*slot, dt, n)
}
