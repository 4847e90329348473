// Package sim is the "sim" device: device memory simulated by host memory that
// host code cannot reach, and the "sim" kernels provider, the cpu kernels running
// on it. It proves the device path without a GPU: a tensor of this memory has no
// host slice (its Float32 panics), every copy between it and the host goes
// through Memory.Read and Memory.Write and is counted, and a freed tensor cannot
// be used again. What runs on "sim" would run on "cuda" without a copy more.
package sim

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/meshrun/meshrun/tensor"
)

// Memory is one simulated device's memory. It is safe for concurrent use on
// distinct tensors. Like the cuda Memory, it runs a device library's calls
// with its context current (Run), has a stream and names its device
// (DeviceID): see context.go.
type Memory struct {
	dev    tensor.Device
	meter  tensor.Meter
	id     string
	stream uintptr
	mu     sync.Mutex   // held by Run
	owner  atomic.Int64 // the OS thread in Run, 0 when none
}

var _ tensor.Memory = (*Memory)(nil)

// NewMemory returns the memory of simulated device sim:ordinal. Memories of
// one ordinal made in one process are one device (one DeviceID), as the
// in-process ranks of a GPU job are on one GPU, unless made under
// SeparateDevices.
func NewMemory(ordinal int) *Memory {
	return &Memory{dev: tensor.Device{Kind: tensor.Sim, Ordinal: ordinal}, id: deviceID(ordinal), stream: streams.Add(256)}
}

// buffer is sim device memory: bytes the host cannot see through the tensor.
type buffer struct {
	mem   *Memory
	data  []byte
	freed bool
	addr  uintptr // see addr.go
}

func (b *buffer) Memory() tensor.Memory { return b.mem }
func (b *buffer) Len() int              { return len(b.data) }

// Device implements tensor.Memory.
func (m *Memory) Device() tensor.Device { return m.dev }

// Alloc implements tensor.Memory.
func (m *Memory) Alloc(dt tensor.DType, shape ...int) (*tensor.Tensor, error) {
	if dt.Size() == 0 {
		return nil, fmt.Errorf("%w: %v", tensor.ErrDType, dt)
	}
	for _, d := range shape {
		if d < 0 {
			return nil, fmt.Errorf("%w: negative dim in %v", tensor.ErrShape, shape)
		}
	}
	n := tensor.NumElements(shape) * dt.Size()
	// Backed by float64s: 8-byte aligned, as device allocations are (more).
	words := make([]float64, (n+7)/8)
	b := &buffer{mem: m}
	if n > 0 {
		b.data = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(words))), n)
	}
	assign(b)
	return tensor.OnDevice(b, dt, shape...)
}

// bytes returns t's device bytes, checking that t is live memory of m.
func (m *Memory) bytes(t *tensor.Tensor) ([]byte, error) {
	b, ok := t.Buffer().(*buffer)
	if !ok || b.mem != m {
		return nil, fmt.Errorf("%w: %v is not memory of %v", tensor.ErrDevice, t, m.dev)
	}
	if b.freed {
		return nil, fmt.Errorf("%w: %v used after Free", tensor.ErrDevice, t)
	}
	return b.data[:t.Bytes()], nil
}

// Free implements tensor.Memory: the tensor's memory is released and any later
// use of it is an error.
func (m *Memory) Free(t *tensor.Tensor) error {
	if _, err := m.bytes(t); err != nil {
		return err
	}
	b := t.Buffer().(*buffer)
	release(b)
	b.freed, b.data = true, nil
	return nil
}

// Read implements tensor.Memory.
func (m *Memory) Read(p []byte, src *tensor.Tensor, off int, why tensor.Purpose) error {
	d, err := m.bytes(src)
	if err != nil {
		return err
	}
	if err := tensor.CheckRange(src, off, len(p)); err != nil {
		return err
	}
	copy(p, d[off:])
	m.meter.Add(why, false, len(p))
	return nil
}

// Write implements tensor.Memory.
func (m *Memory) Write(dst *tensor.Tensor, off int, p []byte, why tensor.Purpose) error {
	d, err := m.bytes(dst)
	if err != nil {
		return err
	}
	if err := tensor.CheckRange(dst, off, len(p)); err != nil {
		return err
	}
	copy(d[off:], p)
	m.meter.Add(why, true, len(p))
	return nil
}

// Copy2D implements tensor.Memory: a copy within the device, not a transfer.
func (m *Memory) Copy2D(dst *tensor.Tensor, dstOff, dstPitch int, src *tensor.Tensor, srcOff, srcPitch, width, rows int) error {
	d, err := m.bytes(dst)
	if err != nil {
		return err
	}
	s, err := m.bytes(src)
	if err != nil {
		return err
	}
	if err := tensor.CheckCopy2D(dst, dstOff, dstPitch, src, srcOff, srcPitch, width, rows); err != nil {
		return err
	}
	tensor.Copy2DBytes(d, dstOff, dstPitch, s, srcOff, srcPitch, width, rows)
	return nil
}

// Zero implements tensor.Memory.
func (m *Memory) Zero(dst *tensor.Tensor, off, n int) error {
	d, err := m.bytes(dst)
	if err != nil {
		return err
	}
	if err := tensor.CheckRange(dst, off, n); err != nil {
		return err
	}
	clear(d[off:][:n])
	return nil
}

// HostAlloc implements tensor.Memory (ordinary host memory: nothing to pin).
func (m *Memory) HostAlloc(n int) ([]byte, error) { return make([]byte, n), nil }

// HostFree implements tensor.Memory.
func (m *Memory) HostFree([]byte) error { return nil }

// Transfers implements tensor.Memory.
func (m *Memory) Transfers() tensor.Transfers { return m.meter.Transfers() }

// view returns a host tensor over t's device bytes, for the kernels only: it is
// the privileged access a GPU kernel has to its own memory.
func (m *Memory) view(t *tensor.Tensor) (*tensor.Tensor, error) {
	if t == nil {
		return nil, nil
	}
	d, err := m.bytes(t)
	if err != nil {
		return nil, err
	}
	shape := t.Shape()
	n := t.Len()
	switch t.DType() {
	case tensor.Float32:
		var s []float32
		if n > 0 {
			s = unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(d))), n)
		}
		return tensor.FromFloat32(s, shape...)
	case tensor.Float64:
		var s []float64
		if n > 0 {
			s = unsafe.Slice((*float64)(unsafe.Pointer(unsafe.SliceData(d))), n)
		}
		return tensor.FromFloat64(s, shape...)
	case tensor.BFloat16:
		var s []tensor.BF16
		if n > 0 {
			s = unsafe.Slice((*tensor.BF16)(unsafe.Pointer(unsafe.SliceData(d))), n)
		}
		return tensor.FromBFloat16(s, shape...)
	}
	return nil, fmt.Errorf("%w: %v", tensor.ErrDType, t.DType())
}
