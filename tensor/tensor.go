// Package tensor holds dense row-major (C order) tensors: a shape, an element type
// and either a host slice or a device buffer owned by a device's Memory. It reads
// and writes NumPy's .npy format. It uses the standard library only.
//
// Device memory is never touched from the host: the host accessors (Float32,
// Float64, At, Clone, WriteNpy) panic or fail on a device tensor, and every copy
// between host and device goes through the device's Memory, which counts it.
package tensor

import (
	"fmt"
	"strings"
)

// DType is the element type of a tensor.
type DType uint8

// Supported element types. The values are also the dtype byte of the
// collective wire header.
const (
	Float32 DType = iota + 1
	Float64
	BFloat16
	numDTypes
)

// Size returns the size of one element in bytes (0 for an unknown type).
func (d DType) Size() int {
	switch d {
	case Float32:
		return 4
	case Float64:
		return 8
	case BFloat16:
		return 2
	}
	return 0
}

// Valid reports whether d is a known element type.
func (d DType) Valid() bool { return d > 0 && d < numDTypes }

func (d DType) String() string {
	switch d {
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	case BFloat16:
		return "bfloat16"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDType reads "float32", "float64" or "bfloat16" (also "fp32", "bf16").
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(s) {
	case "float32", "fp32", "f32":
		return Float32, nil
	case "float64", "fp64", "f64":
		return Float64, nil
	case "bfloat16", "bf16":
		return BFloat16, nil
	}
	return 0, fmt.Errorf("%w: unknown dtype %q (want float32, float64 or bfloat16)", ErrDType, s)
}

// Tensor is a dense, row-major tensor. The zero value is not usable; build one with
// New, FromFloat32, FromFloat64 or OnDevice. Tensors share their storage: Reshape
// and Float32 return views, Clone copies.
type Tensor struct {
	shape []int
	dtype DType
	f32   []float32
	f64   []float64
	b16   []BF16
	buf   Buffer
}

// NumElements returns the product of shape (1 for a scalar shape).
func NumElements(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

func checkShape(shape []int) error {
	n := 1
	for _, d := range shape {
		if d < 0 {
			return fmt.Errorf("%w: negative dim in %v", ErrShape, shape)
		}
		if d > 0 && n > (1<<48)/d {
			return fmt.Errorf("%w: %v too large", ErrShape, shape)
		}
		n *= d
	}
	return nil
}

// New returns a zeroed host tensor. It panics on a negative dimension or an unknown
// dtype, like make does on a bad length.
func New(dt DType, shape ...int) *Tensor {
	if err := checkShape(shape); err != nil {
		panic(err)
	}
	t := &Tensor{shape: append([]int(nil), shape...), dtype: dt}
	n := NumElements(shape)
	switch dt {
	case Float32:
		t.f32 = make([]float32, n)
	case Float64:
		t.f64 = make([]float64, n)
	case BFloat16:
		t.b16 = make([]BF16, n)
	default:
		panic(fmt.Errorf("%w: %v", ErrDType, dt))
	}
	return t
}

// FromFloat32 wraps data (not copied) as a host tensor of the given shape.
func FromFloat32(data []float32, shape ...int) (*Tensor, error) {
	if err := checkShape(shape); err != nil {
		return nil, err
	}
	if n := NumElements(shape); n != len(data) {
		return nil, fmt.Errorf("%w: %v needs %d elements, have %d", ErrShape, shape, n, len(data))
	}
	return &Tensor{shape: append([]int(nil), shape...), dtype: Float32, f32: data}, nil
}

// FromFloat64 wraps data (not copied) as a host tensor of the given shape.
func FromFloat64(data []float64, shape ...int) (*Tensor, error) {
	if err := checkShape(shape); err != nil {
		return nil, err
	}
	if n := NumElements(shape); n != len(data) {
		return nil, fmt.Errorf("%w: %v needs %d elements, have %d", ErrShape, shape, n, len(data))
	}
	return &Tensor{shape: append([]int(nil), shape...), dtype: Float64, f64: data}, nil
}

// OnDevice wraps a device buffer as a tensor. The buffer must hold at least
// NumElements(shape)*dt.Size() bytes.
func OnDevice(buf Buffer, dt DType, shape ...int) (*Tensor, error) {
	if err := checkShape(shape); err != nil {
		return nil, err
	}
	if dt.Size() == 0 {
		return nil, fmt.Errorf("%w: %v", ErrDType, dt)
	}
	if need := NumElements(shape) * dt.Size(); buf == nil || buf.Len() < need {
		return nil, fmt.Errorf("%w: %v %v needs %d bytes", ErrShape, shape, dt, need)
	}
	return &Tensor{shape: append([]int(nil), shape...), dtype: dt, buf: buf}, nil
}

// Shape returns a copy of the shape.
func (t *Tensor) Shape() []int { return append([]int(nil), t.shape...) }

// Rank returns the number of dimensions.
func (t *Tensor) Rank() int { return len(t.shape) }

// Dim returns the size of dimension i; negative i counts from the end.
func (t *Tensor) Dim(i int) int {
	if i < 0 {
		i += len(t.shape)
	}
	return t.shape[i]
}

// SameShape reports whether a and b have the same shape (without allocating).
func SameShape(a, b *Tensor) bool {
	if len(a.shape) != len(b.shape) {
		return false
	}
	for i, d := range a.shape {
		if b.shape[i] != d {
			return false
		}
	}
	return true
}

// Len returns the number of elements.
func (t *Tensor) Len() int { return NumElements(t.shape) }

// DType returns the element type.
func (t *Tensor) DType() DType { return t.dtype }

// Device returns where the data lives.
func (t *Tensor) Device() Device {
	if t.buf != nil {
		return t.buf.Memory().Device()
	}
	return Device{Kind: CPU}
}

// OnHost reports whether the data is a host slice.
func (t *Tensor) OnHost() bool { return t.buf == nil }

// Buffer returns the device buffer, or nil for a host tensor.
func (t *Tensor) Buffer() Buffer { return t.buf }

// Bytes returns the size of the tensor's data in bytes.
func (t *Tensor) Bytes() int { return t.Len() * t.dtype.Size() }

// Float32 returns the host data of a float32 tensor (a view), or nil for another
// dtype. On a device tensor it panics: host code reading or writing device
// memory is a bug, and fails loudly where it happens.
func (t *Tensor) Float32() []float32 {
	if t.buf != nil {
		t.hostAccess("Float32")
	}
	return t.f32
}

// Float64 returns the host data of a float64 tensor (a view), or nil for another
// dtype. On a device tensor it panics, like Float32.
func (t *Tensor) Float64() []float64 {
	if t.buf != nil {
		t.hostAccess("Float64")
	}
	return t.f64
}

// hostAccess panics with ErrDevice: host code touched device memory.
func (t *Tensor) hostAccess(what string) {
	panic(fmt.Errorf("%w: host access (%s) to %v: device memory moves only through its Memory (Read/Write, Upload/Download)", ErrDevice, what, t))
}

// Reshape returns a view with a new shape of the same number of elements.
func (t *Tensor) Reshape(shape ...int) (*Tensor, error) {
	if err := checkShape(shape); err != nil {
		return nil, err
	}
	if NumElements(shape) != t.Len() {
		return nil, fmt.Errorf("%w: cannot reshape %v to %v", ErrShape, t.shape, shape)
	}
	v := *t
	v.shape = append([]int(nil), shape...)
	return &v, nil
}

// Clone returns a deep copy, in the same memory (a device tensor's copy is made
// by its Memory, on the device).
func (t *Tensor) Clone() (*Tensor, error) {
	if t.buf != nil {
		m := t.buf.Memory()
		c, err := m.Alloc(t.dtype, t.shape...)
		if err != nil {
			return nil, err
		}
		if n := t.Bytes(); n > 0 {
			if err := m.Copy2D(c, 0, n, t, 0, n, n, 1); err != nil {
				return nil, err
			}
		}
		return c, nil
	}
	c := &Tensor{shape: append([]int(nil), t.shape...), dtype: t.dtype}
	if t.f32 != nil {
		c.f32 = append([]float32(nil), t.f32...)
	}
	if t.f64 != nil {
		c.f64 = append([]float64(nil), t.f64...)
	}
	if t.b16 != nil {
		c.b16 = append([]BF16(nil), t.b16...)
	}
	return c, nil
}

// At returns element i (flat, row-major) of a host tensor as float64; it panics
// on a device tensor.
func (t *Tensor) At(i int) float64 {
	if t.buf != nil {
		t.hostAccess("At")
	}
	switch t.dtype {
	case Float32:
		return float64(t.f32[i])
	case BFloat16:
		return float64(t.b16[i].Float32())
	}
	return t.f64[i]
}

// String describes the tensor without its data, e.g. "float32[2 3]@cpu".
func (t *Tensor) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v%v@%v", t.dtype, t.shape, t.Device())
	return b.String()
}
