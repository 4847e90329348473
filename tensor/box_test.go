package tensor

import (
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"testing"
)

func TestBoxIntersect(t *testing.T) {
	for _, c := range []struct {
		a, b, want Box
	}{
		{Box{[]int{0, 0}, []int{4, 4}}, Box{[]int{2, 1}, []int{4, 2}}, Box{[]int{2, 1}, []int{2, 2}}},
		{Box{[]int{2, 1}, []int{4, 2}}, Box{[]int{0, 0}, []int{4, 4}}, Box{[]int{2, 1}, []int{2, 2}}},
		{Box{[]int{0}, []int{3}}, Box{[]int{3}, []int{3}}, Box{[]int{3}, []int{0}}}, // touching: empty
		{Box{[]int{0}, []int{3}}, Box{[]int{5}, []int{3}}, Box{[]int{5}, []int{0}}}, // apart: empty
		{Box{[]int{1, 1}, []int{0, 5}}, Box{[]int{0, 0}, []int{4, 4}}, Box{[]int{1, 1}, []int{0, 3}}},
		{Box{[]int{}, []int{}}, Box{[]int{}, []int{}}, Box{[]int{}, []int{}}}, // a scalar
		{Box{[]int{1, 2, 3}, []int{2, 2, 2}}, Box{[]int{1, 2, 3}, []int{2, 2, 2}}, Box{[]int{1, 2, 3}, []int{2, 2, 2}}},
	} {
		got := c.a.Intersect(c.b)
		if !slices.Equal(got.Shape, c.want.Shape) || (!c.want.Empty() && !slices.Equal(got.Offset, c.want.Offset)) {
			t.Errorf("%v ∩ %v = %v, want %v", c.a, c.b, got, c.want)
		}
		if got.Empty() != c.want.Empty() {
			t.Errorf("%v ∩ %v: Empty() = %v", c.a, c.b, got.Empty())
		}
	}
}

func TestBoxIndex(t *testing.T) {
	b := Box{[]int{2, 3, 1}, []int{2, 3, 4}}
	for _, c := range []struct {
		idx  []int
		in   bool
		want int
	}{
		{[]int{2, 3, 1}, true, 0},
		{[]int{2, 3, 4}, true, 3},
		{[]int{2, 4, 1}, true, 4},
		{[]int{3, 5, 4}, true, 23},
		{[]int{4, 3, 1}, false, 0},
		{[]int{2, 2, 1}, false, 0},
		{[]int{2, 3, 5}, false, 0},
	} {
		if got := b.Contains(c.idx); got != c.in {
			t.Errorf("%v.Contains(%v) = %v", b, c.idx, got)
		}
		if c.in {
			if got := b.Index(c.idx); got != c.want {
				t.Errorf("%v.Index(%v) = %d, want %d", b, c.idx, got, c.want)
			}
		}
	}
	if n := b.Len(); n != 24 {
		t.Errorf("Len = %d", n)
	}
	if s := (Box{}); s.Len() != 1 || s.Empty() || s.Index(nil) != 0 {
		t.Errorf("a box of no dims: Len %d, Empty %v", s.Len(), s.Empty())
	}
}

func TestBoxSpan(t *testing.T) {
	whole := Whole([]int{3, 4, 5})
	for _, c := range []struct {
		sub        Box
		start, end int
		contiguous bool
	}{
		{Box{[]int{0, 0, 0}, []int{3, 4, 5}}, 0, 60, true},
		{Box{[]int{1, 0, 0}, []int{2, 4, 5}}, 20, 60, true}, // whole rows of dim 0
		{Box{[]int{1, 2, 0}, []int{1, 2, 5}}, 30, 40, true}, // extent 1, then whole
		{Box{[]int{1, 2, 1}, []int{1, 1, 3}}, 31, 34, true}, // part of one row
		{Box{[]int{0, 1, 0}, []int{2, 2, 5}}, 5, 35, false}, // two slabs
		{Box{[]int{0, 0, 1}, []int{1, 2, 2}}, 1, 8, false},  // two short runs
		{Box{[]int{2, 3, 4}, []int{1, 1, 1}}, 59, 60, true}, // the last element
		{Box{[]int{1, 0, 0}, []int{1, 4, 5}}, 20, 40, true}, // one slab
		{Box{[]int{0, 0, 0}, []int{3, 1, 5}}, 0, 45, false}, // a column of rows
		{Box{[]int{0, 0, 0}, []int{2, 4, 5}}, 0, 40, true},
	} {
		s, e := whole.Span(c.sub)
		if s != c.start || e != c.end || (e-s == c.sub.Len()) != c.contiguous {
			t.Errorf("Span(%v) = %d, %d, want %d, %d (contiguous %v)", c.sub, s, e, c.start, c.end, c.contiguous)
		}
	}
}

type run struct{ d, s, n int }

func TestRuns(t *testing.T) {
	for _, c := range []struct {
		name             string
		region, dst, src Box
		want             []run
	}{
		{"whole in both", Whole([]int{2, 3}), Whole([]int{2, 3}), Whole([]int{2, 3}), []run{{0, 0, 6}}},
		{"rows of a column block", Box{[]int{0, 1}, []int{2, 2}}, Box{[]int{0, 1}, []int{2, 2}}, Whole([]int{2, 4}),
			[]run{{0, 1, 2}, {2, 5, 2}}},
		{"a row block is contiguous in both", Box{[]int{1, 0}, []int{2, 4}}, Whole([]int{4, 4}), Box{[]int{1, 0}, []int{3, 4}},
			[]run{{4, 0, 8}}},
		{"trailing whole dims merge", Box{[]int{0, 1, 0}, []int{2, 2, 3}}, Whole([]int{2, 4, 3}), Box{[]int{0, 1, 0}, []int{2, 3, 3}},
			[]run{{3, 0, 6}, {15, 9, 6}}},
		{"empty", Box{[]int{0, 0}, []int{0, 3}}, Whole([]int{2, 3}), Whole([]int{2, 3}), nil},
		{"no dims", Box{}, Box{}, Box{}, []run{{0, 0, 1}}},
		{"extent-1 outer dims", Box{[]int{1, 2, 0}, []int{1, 1, 4}}, Whole([]int{3, 3, 4}), Box{[]int{1, 0, 0}, []int{1, 3, 4}},
			[]run{{20, 8, 4}}},
	} {
		var got []run
		err := Runs(c.region, c.dst, c.src, func(d, s, n int) error { got = append(got, run{d, s, n}); return nil })
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: runs %v (%v), want %v", c.name, got, err, c.want)
		}
	}
	stop := errors.New("stop")
	calls := 0
	err := Runs(Box{[]int{0, 0}, []int{3, 2}}, Whole([]int{3, 3}), Whole([]int{3, 3}), func(d, s, n int) error { calls++; return stop })
	if err != stop || calls != 1 {
		t.Errorf("Runs returned %v after %d calls, want f's error after 1", err, calls)
	}
}

type block struct{ d, s, dp, sp, n, rows int }

func TestBlocks(t *testing.T) {
	for _, c := range []struct {
		name             string
		region, dst, src Box
		want             []block
	}{
		{"whole", Whole([]int{2, 3}), Whole([]int{2, 3}), Whole([]int{2, 3}), []block{{0, 0, 6, 6, 6, 1}}},
		{"a column block", Box{[]int{0, 1}, []int{3, 2}}, Box{[]int{0, 1}, []int{3, 2}}, Whole([]int{3, 4}),
			[]block{{0, 1, 2, 4, 2, 3}}},
		{"3-D, last dim cut", Box{[]int{0, 0, 1}, []int{2, 2, 2}}, Box{[]int{0, 0, 1}, []int{2, 2, 2}}, Whole([]int{2, 2, 4}),
			[]block{{0, 1, 2, 4, 2, 2}, {4, 9, 2, 4, 2, 2}}},
		{"3-D, middle dim cut", Box{[]int{0, 1, 0}, []int{2, 1, 3}}, Whole([]int{2, 2, 3}), Whole([]int{2, 2, 3}),
			[]block{{3, 3, 6, 6, 3, 2}}},
		{"no dims", Box{}, Box{}, Box{}, []block{{0, 0, 1, 1, 1, 1}}},
		{"empty", Box{[]int{0}, []int{0}}, Whole([]int{3}), Whole([]int{3}), nil},
	} {
		var got []block
		err := Blocks(c.region, c.dst, c.src, func(d, s, dp, sp, n, rows int) error {
			got = append(got, block{d, s, dp, sp, n, rows})
			return nil
		})
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: blocks %v (%v), want %v", c.name, got, err, c.want)
		}
	}
}

func TestBoxEach(t *testing.T) {
	var got [][]int
	Box{[]int{1, 5}, []int{2, 2}}.Each(func(idx []int) { got = append(got, slices.Clone(idx)) })
	if want := [][]int{{1, 5}, {1, 6}, {2, 5}, {2, 6}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Each: %v, want %v", got, want)
	}
	Box{[]int{0, 0}, []int{2, 0}}.Each(func([]int) { t.Error("Each on an empty box called f") })
}

// randomBox is a box of up to 3 elements along each dim of global shape,
// possibly empty.
func randomBox(rng *rand.Rand, shape []int) Box {
	b := Box{make([]int, len(shape)), make([]int, len(shape))}
	for d, n := range shape {
		lo, hi := rng.Intn(n+1), rng.Intn(n+1)
		if rng.Intn(4) == 0 {
			lo, hi = 0, n // whole dims make runs merge
		}
		if lo > hi {
			lo, hi = hi, lo
		}
		b.Offset[d], b.Shape[d] = lo, hi-lo
	}
	return b
}

// naiveCopy copies element by element: for every global index of the tensor,
// if both boxes hold it.
func naiveCopy(dst []float64, db Box, src []float64, sb Box, shape []int) {
	n := NumElements(shape)
	idx := make([]int, len(shape))
	for k := 0; k < n; k++ {
		rem := k
		for d := len(shape) - 1; d >= 0; d-- {
			idx[d] = rem % shape[d]
			rem /= shape[d]
		}
		in := func(b Box) (int, bool) {
			pos := 0
			for d := range idx {
				l := idx[d] - b.Offset[d]
				if l < 0 || l >= b.Shape[d] {
					return 0, false
				}
				pos = pos*b.Shape[d] + l
			}
			return pos, true
		}
		di, okd := in(db)
		si, oks := in(sb)
		if okd && oks {
			dst[di] = src[si]
		}
	}
}

// TestBoxCopyRandom compares CopyBox, Runs and Blocks with the element by
// element copy on random boxes of random tensors of 1 to 5 dims.
func TestBoxCopyRandom(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for try := 0; try < 3000; try++ {
		shape := make([]int, 1+rng.Intn(5))
		for d := range shape {
			shape[d] = 1 + rng.Intn(4)
		}
		db, sb := randomBox(rng, shape), randomBox(rng, shape)
		if rng.Intn(5) == 0 {
			sb = Whole(shape)
		}
		src := make([]float64, sb.Len())
		for i := range src {
			src[i] = float64(i + 1)
		}
		want := make([]float64, db.Len())
		naiveCopy(want, db, src, sb, shape)
		got := make([]float64, db.Len())
		CopyBox(got, db, src, sb)
		if !slices.Equal(got, want) {
			t.Fatalf("shape %v: CopyBox(%v <- %v) = %v, want %v", shape, db, sb, got, want)
		}
		// Blocks covers the same elements, each once, with Copy2D's pitches.
		region := db.Intersect(sb)
		got2 := make([]float64, db.Len())
		elems := 0
		err := Blocks(region, db, sb, func(d, s, dp, sp, n, rows int) error {
			if dp < n || sp < n {
				return fmt.Errorf("pitch %d, %d below run %d", dp, sp, n)
			}
			for r := 0; r < rows; r++ {
				copy(got2[d+r*dp:d+r*dp+n], src[s+r*sp:s+r*sp+n])
				elems += n
			}
			return nil
		})
		if err != nil || !slices.Equal(got2, want) || elems != region.Len()*b2i(!region.Empty()) {
			t.Fatalf("shape %v: Blocks(%v <- %v) = %v (%d elements, %v), want %v", shape, db, sb, got2, elems, err, want)
		}
		// A region contiguous in both layouts is one run.
		if region.Empty() {
			continue
		}
		runs := 0
		Runs(region, db, sb, func(d, s, n int) error { runs++; return nil })
		ds, de := db.Span(region)
		ss, se := sb.Span(region)
		if both := de-ds == region.Len() && se-ss == region.Len(); both != (runs == 1) {
			t.Fatalf("shape %v: region %v of %v and %v: contiguous in both %v, %d runs", shape, region, db, sb, both, runs)
		}
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// The walks allocate nothing: they run for every box a plan's step packs.
// CopyBox allocates its intersection's two slices only.
func TestBoxWalksAllocate(t *testing.T) {
	region := Box{[]int{0, 1, 0, 2}, []int{3, 2, 2, 3}}
	dst, src := Whole([]int{3, 4, 2, 5}), Box{[]int{0, 1, 0, 1}, []int{3, 3, 2, 4}}
	a, b := make([]float64, dst.Len()), make([]float64, src.Len())
	n := 0
	if allocs := testing.AllocsPerRun(100, func() {
		Runs(region, dst, src, func(d, s, k int) error { copy(a[d:d+k], b[s:s+k]); return nil })
		Blocks(region, dst, src, func(d, s, dp, sp, k, rows int) error { n += rows; return nil })
	}); allocs != 0 {
		t.Errorf("Runs and Blocks: %v allocations", allocs)
	}
	if allocs := testing.AllocsPerRun(100, func() { CopyBox(a, dst, b, src) }); allocs > 2 {
		t.Errorf("CopyBox: %v allocations", allocs)
	}
}
