package redistribute

import (
	"slices"
	"testing"

	"github.com/meshrun/meshrun/tensor"
)

func TestContiguous(t *testing.T) {
	big := tensor.Box{Offset: []int{2, 0}, Shape: []int{4, 3}}
	box := func(o0, o1, s0, s1 int) tensor.Box { return tensor.Box{Offset: []int{o0, o1}, Shape: []int{s0, s1}} }
	for _, c := range []struct {
		name string
		bs   []tensor.Box
		want bool
	}{
		{"row blocks in order", []tensor.Box{box(2, 0, 2, 3), box(4, 0, 2, 3)}, true},
		{"row blocks out of order", []tensor.Box{box(4, 0, 2, 3), box(2, 0, 2, 3)}, false},
		{"an empty box skipped", []tensor.Box{box(2, 0, 1, 3), box(3, 0, 0, 3), box(3, 0, 3, 3)}, true},
		{"column blocks", []tensor.Box{box(2, 0, 4, 1), box(2, 1, 4, 2)}, false},
		{"short of the whole", []tensor.Box{box(2, 0, 2, 3)}, false},
		{"single rows split", []tensor.Box{box(2, 0, 1, 3), box(3, 0, 1, 2), box(3, 2, 1, 1), box(4, 0, 2, 3)}, true},
	} {
		if got := contiguous(c.bs, big); got != c.want {
			t.Errorf("%s: contiguous = %v, want %v", c.name, got, c.want)
		}
	}
}

// A block whose rows lie more than maxPitch bytes apart is copied row by row,
// to the same result.
func TestBox2DLargePitch(t *testing.T) {
	src := tensor.Box{Offset: []int{0, 0, 0}, Shape: []int{3, 4, 5}}
	dst := tensor.Box{Offset: []int{0, 1, 0}, Shape: []int{3, 2, 5}} // rows 10 and 20 elements apart
	in := tensor.New(tensor.Float64, src.Len())
	for i := range in.Float64() {
		in.Float64()[i] = float64(i + 1)
	}
	want := make([]float64, dst.Len())
	tensor.CopyBox(want, dst, in.Float64(), src)
	for _, limit := range []int{1 << 31, 8 * 10} {
		maxPitch = limit
		x := &stepExec{mem: tensor.Host, es: 8}
		out := tensor.New(tensor.Float64, dst.Len())
		if err := x.box2D(out, 0, dst, in, 0, src); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(out.Float64(), want) {
			t.Errorf("maxPitch %d: %v, want %v", limit, out.Float64(), want)
		}
	}
	maxPitch = 1<<31 - 1
}
