package tensor

import (
	"fmt"
	"math"
)

// BF16 is a bfloat16 number: the upper 16 bits of a float32 (sign, 8-bit
// exponent, 7-bit mantissa). It has float32's range and about three significant
// decimal digits.
type BF16 uint16

// ToBF16 rounds f to the nearest bfloat16, ties to even (as VCVTNEPS2BF16 and
// PyTorch do). NaN stays NaN (quiet); infinities and zeros keep their sign.
func ToBF16(f float32) BF16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 { // NaN: keep the sign, force a quiet mantissa bit
		return BF16(u>>16 | 0x40)
	}
	return BF16((u + 0x7fff + (u>>16)&1) >> 16)
}

// Float32 widens b exactly.
func (b BF16) Float32() float32 { return math.Float32frombits(uint32(b) << 16) }

func (b BF16) String() string { return fmt.Sprint(b.Float32()) }

// BF16Epsilon is the distance from 1 to the next bfloat16 (2^-7); rounding to
// nearest errs by at most half of it, relative.
const BF16Epsilon = 1.0 / 128

// FromBFloat16 wraps data (not copied) as a host tensor of the given shape.
func FromBFloat16(data []BF16, shape ...int) (*Tensor, error) {
	if err := checkShape(shape); err != nil {
		return nil, err
	}
	if n := NumElements(shape); n != len(data) {
		return nil, fmt.Errorf("%w: %v needs %d elements, have %d", ErrShape, shape, n, len(data))
	}
	return &Tensor{shape: append([]int(nil), shape...), dtype: BFloat16, b16: data}, nil
}

// BFloat16 returns the host data of a bfloat16 tensor (a view), or nil for
// another dtype. On a device tensor it panics, like Float32.
func (t *Tensor) BFloat16() []BF16 {
	if t.buf != nil {
		t.hostAccess("BFloat16")
	}
	return t.b16
}

// Convert returns a host tensor of dtype dt holding t's values (t itself when
// it already has that dtype). Narrowing rounds to nearest even.
func Convert(t *Tensor, dt DType) (*Tensor, error) {
	if t.buf != nil {
		return nil, fmt.Errorf("%w: Convert of a %v tensor", ErrDevice, t.Device())
	}
	if t.dtype == dt {
		return t, nil
	}
	if dt.Size() == 0 {
		return nil, fmt.Errorf("%w: %v", ErrDType, dt)
	}
	out := New(dt, t.shape...)
	n := t.Len()
	for i := 0; i < n; i++ {
		v := t.At(i)
		switch dt {
		case Float32:
			out.f32[i] = float32(v)
		case Float64:
			out.f64[i] = v
		case BFloat16:
			out.b16[i] = ToBF16(float32(v))
		}
	}
	return out, nil
}
