//go:build cuda

package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"gorgonia.org/cu"

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

// Provider runs ops on one GPU, in the device's primary context (the one
// the CUDA runtime, and so NCCL and PyTorch, use: one address space for
// every library of the process), retained on New and released on Close.
// Every call binds the context to the calling OS thread for its duration
// and queues its work on the provider's stream, in call order: kernels,
// cuBLAS, cuBLASLt, copies and the nccl backend's calls (Memory.Run,
// Memory.Stream). Copies to the host wait for the stream (see do). Calls
// are serialized.
//
// What serves each op is planned in plan.go: GEMMs on cuBLASLt with their
// epilogues fused, what it refuses and batches on cuBLAS with the epilogue
// as kernels; the elementwise and transformer ops as the PTX kernels of
// ptx/kernels.h (float64 data of the transformer ops through the host).
type Provider struct {
	mu      sync.Mutex
	ordinal int
	opts    Options
	device  cu.Device
	ctx     cu.CUContext
	stream  cu.Stream
	id      string // the GPU's UUID
	blas    *blasHandle
	ones    map[tensor.DType]*Buffer // vectors of 1s, grown on demand
	scratch [numSlots]*Buffer        // the GEMM plans' scratch, grown on demand
	host    *cpu.Provider            // float64 data of the transformer ops runs on the host
	mem     *Memory
	lt      *lt                    // cuBLASLt (made on first use)
	ew      *elementwise           // the kernels of ptx/kernels.h (loaded on first use)
	served  string                 // the path the last GEMM took (the dispatch table's test reads it)
	pool    map[int][]cu.DevicePtr // freed buffers by poolSize, for the next Alloc (pool.go)
	pooled  int                    // their bytes
}

var _ kernels.MemoryProvider = (*Provider)(nil)

// New opens device ordinal (as numbered under CUDA_VISIBLE_DEVICES), its
// ops run as o says.
func New(ordinal int, o Options) (p *Provider, err error) {
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
	ctx, err := dev.RetainPrimaryCtx()
	if err != nil {
		return nil, fmt.Errorf("cuda: the primary context of device %d: %w", ordinal, err)
	}
	host, err := cpu.New(cpu.Options{})
	if err != nil {
		dev.ReleasePrimaryCtx()
		return nil, err
	}
	p = &Provider{ordinal: ordinal, opts: o, device: dev, ctx: ctx, host: host, ones: map[tensor.DType]*Buffer{}}
	p.mem = &Memory{p: p}
	err = p.on(func() error {
		uuid, err := dev.UUID()
		if err != nil {
			return fmt.Errorf("cuda: device %d's UUID: %w", ordinal, err)
		}
		p.id = "GPU-" + uuid.String()
		if p.stream, err = cu.MakeStream(cu.DefaultStream); err != nil {
			return fmt.Errorf("cuda: stream: %w", err)
		}
		p.blas, err = newBLAS(p.Stream())
		return err
	}, false)
	if err != nil {
		p.on(func() error {
			if p.stream != (cu.Stream{}) {
				p.stream.Destroy()
			}
			return nil
		}, false)
		dev.ReleasePrimaryCtx()
		return nil, err
	}
	return p, nil
}

// Close waits for the stream, releases the provider's buffers, cuBLAS and
// cuBLASLt handles, module and stream, then its hold on the primary context.
func (p *Provider) Close() error {
	var errs []error
	errs = append(errs, p.on(func() error {
		errs := []error{p.stream.Synchronize(), p.releasePool()}
		for _, b := range p.ones {
			errs = append(errs, cu.MemFree(b.ptr))
		}
		for _, b := range p.scratch {
			if b != nil {
				errs = append(errs, cu.MemFree(b.ptr))
			}
		}
		errs = append(errs, p.closeLt(), p.closeElementwise(), p.blas.close(), p.stream.Destroy())
		return errors.Join(errs...)
	}, false))
	errs = append(errs, p.device.ReleasePrimaryCtx())
	return errors.Join(errs...)
}

// do runs f with the context current on a locked OS thread, serialized with
// the provider's other calls. The work f enqueues runs on the provider's
// stream, in order with everything before and after it (kernels, cuBLAS,
// NCCL, copies); do does not wait for it: a copy to the host does, as a
// step's loss does. With Options.Sync (MESHRUN_CUDA_SYNC=1) every op waits
// for its work, so that an error surfaces at the op that caused it.
func (p *Provider) do(f func() error) error { return p.on(f, p.opts.Sync) }

// on runs f with the context current, waiting for the stream if wait.
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
		err = p.sync()
	}
	return err
}

// sync waits for the stream's work (inside on).
func (p *Provider) sync() error {
	if err := p.stream.Synchronize(); err != nil {
		return fmt.Errorf("cuda: synchronize: %w", err)
	}
	return nil
}

// Synchronize waits for all the work queued so far.
func (p *Provider) Synchronize() error { return p.on(p.sync, false) }

// Stream is the provider's CUstream as a number (what NCCL and cuBLASLt take).
func (p *Provider) Stream() uintptr { return *(*uintptr)(unsafe.Pointer(&p.stream)) }

// Run is do for a library that enqueues work on the provider's stream and
// polls for it (NCCL): f runs with the context current on a locked OS
// thread, serialized with the provider's ops, never waiting.
func (m *Memory) Run(f func() error) error { return m.p.on(f, false) }

// Stream is the stream the provider's work runs on: a library that shares
// the memory (NCCL) queues its work there, in order with the kernels.
func (m *Memory) Stream() uintptr { return m.p.Stream() }

// DeviceID is the GPU's identity, "GPU-<uuid>": the same for every process
// that opens it, whatever CUDA_VISIBLE_DEVICES numbers it (two ranks of one
// NCCL communicator must not share it).
func (m *Memory) DeviceID() string { return m.p.id }

// Memory implements kernels.MemoryProvider.
func (p *Provider) Memory() tensor.Memory { return p.mem }

// Memory is the GPU's memory (tensor.Memory). Its copies run on the
// provider's stream, in order with the kernels; those to and from the host
// wait for it.
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
			if b.ptr, err = m.p.take(n); err != nil {
				return err
			}
			return cu.MemsetD8Async(b.ptr, 0, int64(n), m.p.stream)
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

// Free implements tensor.Memory. The buffer goes back to the provider's
// pool without waiting: the stream's work queued before, which may still
// use it, runs before any work queued after on the buffer's next owner.
func (m *Memory) Free(t *tensor.Tensor) error {
	b, err := m.buffer(t)
	if err != nil || b.n == 0 {
		return err
	}
	err = m.p.do(func() error {
		m.p.give(b.ptr, b.n)
		return nil
	})
	b.ptr = 0
	return err
}

// free releases device memory once the stream's work is done (inside do).
func (p *Provider) free(ptr cu.DevicePtr) error {
	return errors.Join(p.sync(), cu.MemFree(ptr))
}

// Read implements tensor.Memory: after the work queued before it.
func (m *Memory) Read(p []byte, src *tensor.Tensor, off int, why tensor.Purpose) error {
	b, err := m.buffer(src)
	if err != nil {
		return err
	}
	if err := tensor.CheckRange(src, off, len(p)); err != nil || len(p) == 0 {
		return err
	}
	m.meter.Add(why, false, len(p))
	return m.p.on(func() error {
		if err := cu.MemcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(p)), b.ptr+cu.DevicePtr(off), int64(len(p)), m.p.stream); err != nil {
			return err
		}
		return m.p.sync()
	}, false)
}

// Write implements tensor.Memory: it returns once p has been copied (p may
// be page-locked staging memory, which the copy reads asynchronously).
func (m *Memory) Write(dst *tensor.Tensor, off int, p []byte, why tensor.Purpose) error {
	b, err := m.buffer(dst)
	if err != nil {
		return err
	}
	if err := tensor.CheckRange(dst, off, len(p)); err != nil || len(p) == 0 {
		return err
	}
	m.meter.Add(why, true, len(p))
	return m.p.on(func() error {
		if err := cu.MemcpyHtoDAsync(b.ptr+cu.DevicePtr(off), unsafe.Pointer(unsafe.SliceData(p)), int64(len(p)), m.p.stream); err != nil {
			return err
		}
		return m.p.sync()
	}, false)
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
		return m.p.copy2D(uint64(d.ptr)+uint64(dstOff), dstPitch, uint64(s.ptr)+uint64(srcOff), srcPitch, width, rows)
	})
}

// memset queues zeroing n bytes at device address a (inside do).
func (p *Provider) memset(a uint64, n int) error {
	if n == 0 {
		return nil
	}
	return cu.MemsetD8Async(cu.DevicePtr(a), 0, int64(n), p.stream)
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
	return m.p.do(func() error { return m.p.memset(uint64(b.ptr)+uint64(off), n) })
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

// Has implements kernels.Provider: every op, each dtype of DTypes by the
// path plan.go gives it (the dispatch-table tests check that none is
// refused).
func (p *Provider) Has(op kernels.Op) bool { return true }

// DTypes implements kernels.Provider.
func (p *Provider) DTypes() []tensor.DType { return providerDTypes }

func (p *Provider) onDevice(ts ...*tensor.Tensor) error {
	return kernels.SameDevice(tensor.CUDA, ts...)
}

// dev is t's device address.
func dev(t *tensor.Tensor) uint64 { return uint64(t.Buffer().(*Buffer).ptr) }

// addr implements planDevice.
func (p *Provider) addr(t *tensor.Tensor) uint64 { return dev(t) }

// onesVec returns the address of a device vector of at least n ones of dtype
// dt (inside do).
func (p *Provider) onesVec(dt tensor.DType, n int) (uint64, error) {
	if b := p.ones[dt]; b != nil && b.n >= n*dt.Size() {
		return uint64(b.ptr), nil
	}
	if b := p.ones[dt]; b != nil {
		delete(p.ones, dt)
		if err := p.free(b.ptr); err != nil {
			return 0, err
		}
	}
	size := max(n, 1024)
	ptr, err := cu.MemAlloc(int64(size * dt.Size()))
	if err != nil {
		return 0, err
	}
	h := tensor.HostBytes(kernels.Ones(dt, size))
	if err := cu.MemcpyHtoDAsync(ptr, unsafe.Pointer(unsafe.SliceData(h)), int64(len(h)), p.stream); err == nil {
		err = p.sync() // h is Go memory: the copy completes before it goes
	}
	if err != nil {
		cu.MemFree(ptr)
		return 0, err
	}
	p.ones[dt] = &Buffer{ptr: ptr, n: len(h), mem: p.mem}
	return uint64(ptr), nil
}

// scratchBuf returns the address of slot's scratch buffer of at least n
// bytes (inside do): allocated on first use, regrown when too small.
func (p *Provider) scratchBuf(slot, n int) (uint64, error) {
	if b := p.scratch[slot]; b != nil && b.n >= n {
		return uint64(b.ptr), nil
	}
	if b := p.scratch[slot]; b != nil {
		p.scratch[slot] = nil
		if err := p.free(b.ptr); err != nil {
			return 0, err
		}
	}
	ptr, err := cu.MemAlloc(int64(max(n, 1)))
	if err != nil {
		return 0, fmt.Errorf("cuda: %d bytes of scratch: %w", n, err)
	}
	p.scratch[slot] = &Buffer{ptr: ptr, n: max(n, 1), mem: p.mem}
	return uint64(ptr), nil
}
