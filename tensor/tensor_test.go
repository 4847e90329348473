package tensor

import (
	"bytes"
	"errors"
	"math"
	"path/filepath"
	"reflect"
	"testing"
)

func TestNewAndViews(t *testing.T) {
	x := New(Float32, 2, 3)
	if x.Len() != 6 || x.Rank() != 2 || x.Dim(-1) != 3 || x.DType() != Float32 || !x.OnHost() {
		t.Fatalf("bad tensor %v", x)
	}
	x.Float32()[4] = 7
	y, err := x.Reshape(3, 2)
	if err != nil || y.Float32()[4] != 7 {
		t.Fatalf("reshape: %v", err)
	}
	if _, err := x.Reshape(4, 2); !errors.Is(err, ErrShape) {
		t.Fatalf("want ErrShape, got %v", err)
	}
	if _, err := FromFloat64(make([]float64, 5), 2, 3); !errors.Is(err, ErrShape) {
		t.Fatalf("want ErrShape, got %v", err)
	}
	c, _ := x.Clone()
	c.Float32()[0] = 1
	if x.Float32()[0] != 0 {
		t.Fatal("clone shares storage")
	}
	if got := x.String(); got != "float32[2 3]@cpu" {
		t.Fatalf("String = %q", got)
	}
}

func TestNpyRoundTrip(t *testing.T) {
	cases := []struct {
		name  string
		dt    DType
		shape []int
	}{
		{"scalar32", Float32, []int{}},
		{"vec64", Float64, []int{5}},
		{"mat32", Float32, []int{3, 4}},
		{"empty", Float32, []int{0, 7}},
		{"rank4", Float64, []int{2, 1, 3, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x := New(tc.dt, tc.shape...)
			for i := 0; i < x.Len(); i++ {
				if tc.dt == Float32 {
					x.Float32()[i] = float32(i) * -1.5
				} else {
					x.Float64()[i] = math.Pi * float64(i)
				}
			}
			var buf bytes.Buffer
			if err := x.WriteNpy(&buf); err != nil {
				t.Fatal(err)
			}
			if buf.Len()%64 != (x.Len()*tc.dt.Size())%64 {
				t.Errorf("header not 64-byte aligned: %d", buf.Len())
			}
			y, err := ReadNpy(&buf)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(x.Shape(), y.Shape()) || x.DType() != y.DType() {
				t.Fatalf("got %v want %v", y, x)
			}
			for i := 0; i < x.Len(); i++ {
				if x.At(i) != y.At(i) {
					t.Fatalf("element %d: %v != %v", i, y.At(i), x.At(i))
				}
			}
		})
	}
}

func TestNpyFile(t *testing.T) {
	x, _ := FromFloat32([]float32{1, 2, 3}, 3)
	p := filepath.Join(t.TempDir(), "x.npy")
	if err := x.Save(p); err != nil {
		t.Fatal(err)
	}
	y, err := Load(p)
	if err != nil || y.Float32()[2] != 3 {
		t.Fatalf("load: %v %v", y, err)
	}
}

// numpy's own output for np.arange(6, dtype='>f8').reshape(2, 3) and a float32
// vector, to pin the format against the reference writer.
func TestNpyNumpyHeaders(t *testing.T) {
	hdr := func(h string, data []byte) []byte {
		pad := (64 - (10+len(h)+1)%64) % 64
		full := h + string(bytes.Repeat([]byte(" "), pad)) + "\n"
		b := append([]byte("\x93NUMPY\x01\x00"), byte(len(full)), byte(len(full)>>8))
		return append(append(b, full...), data...)
	}
	be := []byte{0x3f, 0xf0, 0, 0, 0, 0, 0, 0}
	y, err := ReadNpy(bytes.NewReader(hdr("{'descr': '>f8', 'fortran_order': False, 'shape': (1,), }", be)))
	if err != nil || y.Float64()[0] != 1 {
		t.Fatalf("big endian: %v %v", y, err)
	}
	bad := []string{
		"{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }",
		"{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }",
		"{'descr': '<f4', 'shape': (1,), }",
		"{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
		"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
	}
	for _, h := range bad {
		if _, err := ReadNpy(bytes.NewReader(hdr(h, make([]byte, 8)))); err == nil {
			t.Errorf("accepted %s", h)
		}
	}
	if _, err := ReadNpy(bytes.NewReader(hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", make([]byte, 8)))); !errors.Is(err, ErrFormat) {
		t.Errorf("short data: %v", err)
	}
}

func FuzzReadNpy(f *testing.F) {
	for _, x := range []*Tensor{New(Float32, 2, 3), New(Float64, 4), New(Float32)} {
		var buf bytes.Buffer
		x.WriteNpy(&buf)
		f.Add(buf.Bytes())
	}
	f.Add([]byte("\x93NUMPY\x01\x00\x10\x00{'shape': (),}  \n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		x, err := ReadNpy(bytes.NewReader(data))
		if err != nil {
			return
		}
		// Whatever decodes must survive a round trip bit for bit.
		var buf bytes.Buffer
		if err := x.WriteNpy(&buf); err != nil {
			t.Fatal(err)
		}
		y, err := ReadNpy(&buf)
		if err != nil {
			t.Fatalf("re-read: %v", err)
		}
		if !reflect.DeepEqual(x.Shape(), y.Shape()) || x.Len() != y.Len() {
			t.Fatalf("shape changed: %v -> %v", x, y)
		}
		for i := 0; i < x.Len(); i++ {
			a, b := x.At(i), y.At(i)
			if math.Float64bits(a) != math.Float64bits(b) {
				t.Fatalf("element %d changed", i)
			}
		}
	})
}

func TestBF16(t *testing.T) {
	for _, tc := range []struct {
		in   float32
		want uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		{0, 0},
		{float32(math.Copysign(0, -1)), 0x8000},
		{float32(math.Inf(1)), 0x7f80},
		{float32(math.Inf(-1)), 0xff80},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie, even below: stays
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie, odd below: rounds up
		{math.Float32frombits(0x3f808001), 0x3f81}, // above the tie: up
		{math.Float32frombits(0x7f7fffff), 0x7f80}, // largest float32 rounds to +Inf
		{math.Float32frombits(0x00000001), 0x0000}, // smallest subnormal rounds to 0
	} {
		if got := ToBF16(tc.in); uint16(got) != tc.want {
			t.Errorf("ToBF16(%v = %#x) = %#x, want %#x", tc.in, math.Float32bits(tc.in), uint16(got), tc.want)
		}
	}
	if b := ToBF16(float32(math.NaN())); !math.IsNaN(float64(b.Float32())) {
		t.Errorf("NaN became %v", b)
	}
	// Round trip of every bfloat16 that is a number.
	for u := 0; u < 1<<16; u++ {
		b := BF16(u)
		if f := b.Float32(); !math.IsNaN(float64(f)) && ToBF16(f) != b {
			t.Fatalf("%#x -> %v -> %#x", u, f, uint16(ToBF16(f)))
		}
	}
	// The relative rounding error is at most half an epsilon.
	for _, f := range []float32{1.2345678, 3e-20, -7e30, 0.1} {
		got := float64(ToBF16(f).Float32())
		if math.Abs(got-float64(f)) > BF16Epsilon/2*math.Abs(float64(f)) {
			t.Errorf("ToBF16(%v) = %v", f, got)
		}
	}
	x, _ := FromFloat32([]float32{1.5, -0.1, 3}, 3)
	b, err := Convert(x, BFloat16)
	if err != nil || b.DType() != BFloat16 || b.At(0) != 1.5 || b.At(2) != 3 {
		t.Fatalf("convert: %v %v", b, err)
	}
	// .npy: written as float32, exactly.
	var buf bytes.Buffer
	if err := b.WriteNpy(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := ReadNpy(&buf)
	if err != nil || back.DType() != Float32 || back.At(1) != float64(ToBF16(-0.1).Float32()) {
		t.Fatalf("npy: %v %v", back, err)
	}
	if dt, err := ParseDType("bf16"); err != nil || dt != BFloat16 || dt.Size() != 2 {
		t.Errorf("ParseDType: %v %v", dt, err)
	}
}
