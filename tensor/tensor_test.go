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
