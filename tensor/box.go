package tensor

// Box is a dense block of a row-major tensor: the global index of its first
// element and its extent along each dim. A shard of a sharded tensor, a
// checkpoint file's piece of a tensor and the part of a shard a collective
// moves are boxes; a buffer holding a box stores its elements densely in
// row-major order, so element idx (a global index inside the box) is at
// b.Index(idx).
//
// Box values share their slices: the methods never modify them, and a box
// they return holds fresh slices.
type Box struct {
	Offset []int
	Shape  []int
}

// Whole is the box of a whole tensor of the given shape (offset zero).
func Whole(shape []int) Box {
	return Box{Offset: make([]int, len(shape)), Shape: shape}
}

// NDim is the number of dims.
func (b Box) NDim() int { return len(b.Shape) }

// Len is the number of elements (1 for a box of no dims).
func (b Box) Len() int { return NumElements(b.Shape) }

// Empty reports whether the box holds no element.
func (b Box) Empty() bool {
	for _, n := range b.Shape {
		if n <= 0 {
			return true
		}
	}
	return false
}

// Contains reports whether global index idx lies in b.
func (b Box) Contains(idx []int) bool {
	for d, i := range idx {
		if i < b.Offset[d] || i >= b.Offset[d]+b.Shape[d] {
			return false
		}
	}
	return true
}

// Index is the row-major position within b of global index idx, which must
// lie in b.
func (b Box) Index(idx []int) int {
	k := 0
	for d, n := range b.Shape {
		k = k*n + idx[d] - b.Offset[d]
	}
	return k
}

// Intersect returns the box of the elements both b and o hold. Disjoint boxes
// give an empty box (extent 0 along a dim where they do not meet).
func (b Box) Intersect(o Box) Box {
	r := Box{Offset: make([]int, len(b.Shape)), Shape: make([]int, len(b.Shape))}
	for d := range b.Shape {
		lo, hi := max(b.Offset[d], o.Offset[d]), min(b.Offset[d]+b.Shape[d], o.Offset[d]+o.Shape[d])
		r.Offset[d], r.Shape[d] = lo, max(hi-lo, 0)
	}
	return r
}

// Span returns where the non-empty sub-box sub, which lies in b, sits in b's
// row-major layout: the position of its first element and one past its last.
// sub's elements are one contiguous range of b exactly when end-start equals
// sub.Len().
func (b Box) Span(sub Box) (start, end int) {
	first, last := 0, 0
	for d, n := range b.Shape {
		first = first*n + sub.Offset[d] - b.Offset[d]
		last = last*n + sub.Offset[d] + sub.Shape[d] - 1 - b.Offset[d]
	}
	return first, last + 1
}

// maxStackDims is the number of dims the walks below keep their index in
// without allocating.
const maxStackDims = 8

// fold splits region, which lies in the boxes dst and src, into the dims a
// walk iterates and the run each step of it copies: dims k.. are contiguous
// in both buffers (every dim after k is whole in region, dst and src) and
// form runs of n elements. A region of no dims is one run of one element.
func fold(region, dst, src Box) (k, n int) {
	nd := len(region.Shape)
	if nd == 0 {
		return 0, 1
	}
	k, n = nd-1, region.Shape[nd-1]
	for k > 0 && region.Shape[k] == dst.Shape[k] && region.Shape[k] == src.Shape[k] {
		k--
		n *= region.Shape[k]
	}
	return k, n
}

// Runs walks region, a box that lies in both the dst box and the src box, in
// row-major order as runs contiguous in both buffers, and calls f with each
// run's position in dst's layout, its position in src's layout and its
// length. Trailing dims that region, dst and src all hold whole are merged
// into one run, so a region contiguous in both is a single call. An empty
// region makes no call. Runs returns f's first error.
func Runs(region, dst, src Box, f func(d, s, n int) error) error {
	if region.Empty() {
		return nil
	}
	k, n := fold(region, dst, src)
	return walk(region, dst, src, k, func(d, s int) error { return f(d, s, n) })
}

// Blocks is Runs in 2-D blocks: each call covers rows runs of n elements
// (the runs of Runs along the dim just outside them), starting at position d
// of dst's layout and s of src's, the runs dPitch elements apart in dst and
// sPitch in src. It serves strided 2-D copies (a device's Memory.Copy2D).
func Blocks(region, dst, src Box, f func(d, s, dPitch, sPitch, n, rows int) error) error {
	if region.Empty() {
		return nil
	}
	k, n := fold(region, dst, src)
	if k == 0 {
		return f(dst.Index(region.Offset), src.Index(region.Offset), n, n, n, 1)
	}
	// The block's rows run along dim k-1: one step of it is the product of the
	// extents after it.
	dPitch, sPitch := 1, 1
	for d := k; d < len(region.Shape); d++ {
		dPitch *= dst.Shape[d]
		sPitch *= src.Shape[d]
	}
	rows := region.Shape[k-1]
	return walk(region, dst, src, k-1, func(d, s int) error { return f(d, s, dPitch, sPitch, n, rows) })
}

// walk calls f with the positions in dst's and src's layouts of each index of
// region whose dims k.. are at region's offset, in row-major order.
func walk(region, dst, src Box, k int, f func(d, s int) error) error {
	var stack [maxStackDims]int
	idx := stack[:0]
	if len(region.Offset) > maxStackDims {
		idx = make([]int, 0, len(region.Offset))
	}
	idx = append(idx, region.Offset...)
	for {
		if err := f(dst.Index(idx), src.Index(idx)); err != nil {
			return err
		}
		d := k - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < region.Offset[d]+region.Shape[d] {
				break
			}
			idx[d] = region.Offset[d]
		}
		if d < 0 {
			return nil
		}
	}
}

// CopyBox copies the elements the boxes db and sb share from src, a dense
// row-major buffer holding sb, into dst, holding db.
func CopyBox[T any](dst []T, db Box, src []T, sb Box) {
	_ = Runs(db.Intersect(sb), db, sb, func(d, s, n int) error {
		copy(dst[d:d+n], src[s:s+n])
		return nil
	})
}

// Each calls f with every global index of b in row-major order. The slice is
// reused from call to call: f must not keep it.
func (b Box) Each(f func(idx []int)) {
	if b.Empty() {
		return
	}
	idx := append([]int(nil), b.Offset...)
	for {
		f(idx)
		d := len(idx) - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < b.Offset[d]+b.Shape[d] {
				break
			}
			idx[d] = b.Offset[d]
		}
		if d < 0 {
			return
		}
	}
}
