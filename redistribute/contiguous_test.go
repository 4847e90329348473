package redistribute

import (
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
