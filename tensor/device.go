package tensor

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"unsafe"
)

// DeviceKind names where a tensor's memory lives.
type DeviceKind uint8

// Device kinds.
const (
	// CPU is host memory: Go slices.
	CPU DeviceKind = iota
	// CUDA is an NVIDIA GPU's memory (the cuda kernels provider, cuda builds).
	CUDA
	// Sim is simulated device memory: host memory behind the device interface,
	// which host code cannot reach (kernels/sim). CI proves the device path on it.
	Sim
	numKinds
)

// DeviceKinds lists every kind, in order.
func DeviceKinds() []DeviceKind { return []DeviceKind{CPU, CUDA, Sim} }

func (k DeviceKind) String() string {
	switch k {
	case CPU:
		return "cpu"
	case CUDA:
		return "cuda"
	case Sim:
		return "sim"
	}
	return fmt.Sprintf("device(%d)", uint8(k))
}

// ParseDeviceKind reads "cpu", "cuda" or "sim".
func ParseDeviceKind(s string) (DeviceKind, error) {
	for k := CPU; k < numKinds; k++ {
		if s == k.String() {
			return k, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown device %q (want cpu, cuda or sim)", ErrDevice, s)
}

// Device is a device kind and an ordinal (the GPU index for CUDA, 0 for the host).
type Device struct {
	Kind    DeviceKind
	Ordinal int
}

func (d Device) String() string {
	if d.Kind == CPU {
		return "cpu"
	}
	return fmt.Sprintf("%s:%d", d.Kind, d.Ordinal)
}

// ParseDevice reads "cpu", "cuda", "cuda:1", "sim" or "sim:0" (no ordinal: 0).
func ParseDevice(s string) (Device, error) {
	name, ord, hasOrd := strings.Cut(s, ":")
	k, err := ParseDeviceKind(name)
	if err != nil {
		return Device{}, err
	}
	d := Device{Kind: k}
	if hasOrd {
		n, err := strconv.Atoi(ord)
		if err != nil || n < 0 || k == CPU {
			return Device{}, fmt.Errorf("%w: bad device %q (want cpu, cuda[:N] or sim[:N])", ErrDevice, s)
		}
		d.Ordinal = n
	}
	return d, nil
}

// Buffer is device memory holding a tensor's data. A device's Memory creates
// buffers; the tensor package only carries them.
type Buffer interface {
	// Memory is the device memory the buffer belongs to.
	Memory() Memory
	// Len returns the buffer's size in bytes.
	Len() int
}

// Purpose says why data crosses between host and device, for the counts.
type Purpose uint8

const (
	// Transfer: the program moves a tensor (parameters in, a loss or a dump out).
	Transfer Purpose = iota
	// Staging: a collective backend stages a device buffer through host memory.
	Staging
)

// Memory is one device's memory as code that does not compute sees it: it
// allocates device tensors, copies between them and host memory, and copies
// within the device. Kernel providers implement it for their device; the
// collective layer stages device buffers through it. Every copy between host
// and device goes through a Memory, which counts it (Transfers).
//
// Offsets, pitches and sizes are in bytes.
type Memory interface {
	// Device is the device the memory belongs to.
	Device() Device
	// Alloc returns a zeroed tensor of the device.
	Alloc(dt DType, shape ...int) (*Tensor, error)
	// Free releases a tensor's memory; using the tensor afterwards is an error.
	Free(t *Tensor) error
	// Read copies device tensor src's bytes [off, off+len(p)) into host memory p.
	Read(p []byte, src *Tensor, off int, why Purpose) error
	// Write copies host memory p into device tensor dst at byte off.
	Write(dst *Tensor, off int, p []byte, why Purpose) error
	// Copy2D copies rows runs of width bytes within the device: run r goes from
	// src at srcOff + r·srcPitch to dst at dstOff + r·dstPitch (cuMemcpy2D's
	// shape). Source and destination must not overlap.
	Copy2D(dst *Tensor, dstOff, dstPitch int, src *Tensor, srcOff, srcPitch, width, rows int) error
	// Zero sets n bytes of dst from off to zero.
	Zero(dst *Tensor, off, n int) error
	// HostAlloc returns n bytes of host memory that the device copies to and
	// from fastest (pinned on a GPU), for staging; HostFree releases it.
	HostAlloc(n int) ([]byte, error)
	HostFree(p []byte) error
	// Transfers returns the host-device copies made so far.
	Transfers() Transfers
}

// Count is a number of copies and the bytes they moved.
type Count struct {
	Calls int64 `json:"calls"`
	Bytes int64 `json:"bytes"`
}

// Transfers counts the copies between a device and host memory, by direction
// and purpose.
type Transfers struct {
	H2D, D2H             Count // Transfer: what the program moved
	StagedH2D, StagedD2H Count // Staging: what a collective backend staged
}

// Sub returns t - u (the copies made between two readings).
func (t Transfers) Sub(u Transfers) Transfers {
	sub := func(a, b Count) Count { return Count{a.Calls - b.Calls, a.Bytes - b.Bytes} }
	return Transfers{sub(t.H2D, u.H2D), sub(t.D2H, u.D2H), sub(t.StagedH2D, u.StagedH2D), sub(t.StagedD2H, u.StagedD2H)}
}

// Meter counts copies for a Memory implementation; its zero value is ready.
// It is safe for concurrent use.
type Meter struct {
	c [4][2]atomic.Int64 // [h2d, d2h, staged h2d, staged d2h][calls, bytes]
}

// Add records one copy of n bytes; toDevice is its direction.
func (m *Meter) Add(why Purpose, toDevice bool, n int) {
	i := 0
	if !toDevice {
		i = 1
	}
	if why == Staging {
		i += 2
	}
	m.c[i][0].Add(1)
	m.c[i][1].Add(int64(n))
}

// Transfers returns the counts.
func (m *Meter) Transfers() Transfers {
	get := func(i int) Count { return Count{m.c[i][0].Load(), m.c[i][1].Load()} }
	return Transfers{get(0), get(1), get(2), get(3)}
}

// CheckRange reports whether [off, off+n) lies inside t's data.
func CheckRange(t *Tensor, off, n int) error {
	if off < 0 || n < 0 || off+n > t.Bytes() {
		return fmt.Errorf("%w: bytes [%d, %d) of %v (%d bytes)", ErrShape, off, off+n, t, t.Bytes())
	}
	return nil
}

// Check2D reports whether a Copy2D's runs lie inside t's data.
func Check2D(t *Tensor, off, pitch, width, rows int) error {
	if rows == 0 || width == 0 {
		return nil
	}
	if pitch < width || rows < 0 {
		return fmt.Errorf("%w: copy of %d rows of %d bytes with pitch %d", ErrShape, rows, width, pitch)
	}
	return CheckRange(t, off, (rows-1)*pitch+width)
}

// CheckCopy2D reports whether both sides of a Copy2D lie inside their tensors.
func CheckCopy2D(dst *Tensor, dstOff, dstPitch int, src *Tensor, srcOff, srcPitch, width, rows int) error {
	if err := Check2D(dst, dstOff, dstPitch, width, rows); err != nil {
		return err
	}
	return Check2D(src, srcOff, srcPitch, width, rows)
}

// HostBytes views a host tensor's data as bytes (not a copy).
func HostBytes(t *Tensor) []byte {
	if t.buf != nil {
		t.hostAccess("HostBytes")
	}
	switch {
	case len(t.f32) > 0:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(t.f32))), 4*len(t.f32))
	case len(t.f64) > 0:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(t.f64))), 8*len(t.f64))
	case len(t.b16) > 0:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(t.b16))), 2*len(t.b16))
	}
	return nil
}

// Host is the host's Memory: tensors are Go slices, and nothing it does is a
// transfer (it counts nothing).
var Host Memory = hostMemory{}

type hostMemory struct{}

func (hostMemory) Device() Device { return Device{Kind: CPU} }

func (hostMemory) Alloc(dt DType, shape ...int) (*Tensor, error) {
	if err := checkShape(shape); err != nil {
		return nil, err
	}
	if dt.Size() == 0 {
		return nil, fmt.Errorf("%w: %v", ErrDType, dt)
	}
	return New(dt, shape...), nil
}

func (hostMemory) Free(*Tensor) error { return nil }

func hostOnly(ts ...*Tensor) error {
	for _, t := range ts {
		if t.buf != nil {
			return fmt.Errorf("%w: %v given to host memory", ErrDevice, t)
		}
	}
	return nil
}

func (hostMemory) Read(p []byte, src *Tensor, off int, _ Purpose) error {
	if err := hostOnly(src); err != nil {
		return err
	}
	if err := CheckRange(src, off, len(p)); err != nil {
		return err
	}
	copy(p, HostBytes(src)[off:])
	return nil
}

func (hostMemory) Write(dst *Tensor, off int, p []byte, _ Purpose) error {
	if err := hostOnly(dst); err != nil {
		return err
	}
	if err := CheckRange(dst, off, len(p)); err != nil {
		return err
	}
	copy(HostBytes(dst)[off:], p)
	return nil
}

func (hostMemory) Copy2D(dst *Tensor, dstOff, dstPitch int, src *Tensor, srcOff, srcPitch, width, rows int) error {
	if err := hostOnly(dst, src); err != nil {
		return err
	}
	if err := CheckCopy2D(dst, dstOff, dstPitch, src, srcOff, srcPitch, width, rows); err != nil {
		return err
	}
	Copy2DBytes(HostBytes(dst), dstOff, dstPitch, HostBytes(src), srcOff, srcPitch, width, rows)
	return nil
}

// Copy2DBytes is Copy2D on byte slices (already checked).
func Copy2DBytes(dst []byte, dstOff, dstPitch int, src []byte, srcOff, srcPitch, width, rows int) {
	if width == 0 {
		return
	}
	for r := 0; r < rows; r++ {
		copy(dst[dstOff+r*dstPitch:][:width], src[srcOff+r*srcPitch:][:width])
	}
}

func (hostMemory) Zero(dst *Tensor, off, n int) error {
	if err := hostOnly(dst); err != nil {
		return err
	}
	if err := CheckRange(dst, off, n); err != nil {
		return err
	}
	clear(HostBytes(dst)[off:][:n])
	return nil
}

func (hostMemory) HostAlloc(n int) ([]byte, error) { return make([]byte, n), nil }
func (hostMemory) HostFree([]byte) error           { return nil }
func (hostMemory) Transfers() Transfers            { return Transfers{} }

// MemoryOf returns the memory t lives in: its buffer's, or Host.
func MemoryOf(t *Tensor) Memory {
	if t.buf != nil {
		return t.buf.Memory()
	}
	return Host
}

// Upload copies host tensor h into a new tensor of m (counted as a Transfer).
// On the host it returns h itself.
func Upload(m Memory, h *Tensor) (*Tensor, error) {
	if m.Device().Kind == CPU {
		return h, hostOnly(h)
	}
	if err := hostOnly(h); err != nil {
		return nil, err
	}
	d, err := m.Alloc(h.dtype, h.shape...)
	if err != nil {
		return nil, err
	}
	if h.Bytes() > 0 {
		if err := m.Write(d, 0, HostBytes(h), Transfer); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Download returns a host tensor holding t's data: t itself when it is on the
// host, else a copy (counted as a Transfer).
func Download(t *Tensor) (*Tensor, error) {
	if t.buf == nil {
		return t, nil
	}
	h := New(t.dtype, t.shape...)
	if t.Bytes() > 0 {
		if err := t.buf.Memory().Read(HostBytes(h), t, 0, Transfer); err != nil {
			return nil, err
		}
	}
	return h, nil
}
