package placement

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/meshrun/meshrun/tensor"
)

// ShardRange is the one function that decides shard sizes: the offset and size
// of piece r when a dim of length n is split into p pieces. Balanced gives
// floor(n/p) + (r < n mod p ? 1 : 0); Chunk gives ceil(n/p) to each piece until
// the dim runs out. Any n >= 0 works, including n < p and n = 0.
func ShardRange(n, p, r int, split Split) (offset, size int) {
	if p <= 0 || r < 0 || r >= p || n < 0 {
		panic(fmt.Sprintf("placement: ShardRange(n=%d, p=%d, r=%d)", n, p, r))
	}
	if split == Chunk {
		c := n/p + b2i(n%p != 0)
		if c == 0 || r > n/c {
			return n, 0
		}
		offset = r * c
		return offset, min(c, n-offset)
	}
	q, rem := n/p, n%p
	return r*q + min(r, rem), q + b2i(r < rem)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Spec is a tensor's global shape, the mesh it lives on and one placement per
// mesh dim. A tensor dim may be sharded by several mesh dims: they nest left to
// right (the lower mesh dim splits first, the next splits each piece again).
// All partial placements of a spec share one reduce op.
type Spec struct {
	Shape      []int
	Mesh       Mesh
	Placements []Placement
}

// NewSpec builds and validates a spec.
func NewSpec(shape []int, mesh Mesh, ps ...Placement) (Spec, error) {
	s := Spec{Shape: append([]int(nil), shape...), Mesh: mesh, Placements: append([]Placement(nil), ps...)}
	return s, s.Validate()
}

// MustSpec is NewSpec that panics on error, for tests and literals.
func MustSpec(shape []int, mesh Mesh, ps ...Placement) Spec {
	s, err := NewSpec(shape, mesh, ps...)
	if err != nil {
		panic(err)
	}
	return s
}

// Validate reports the first problem with the spec.
func (s Spec) Validate() error {
	if s.Mesh.NDim() == 0 {
		return fmt.Errorf("%w: spec %s has no mesh", ErrInvalid, s)
	}
	if len(s.Placements) != s.Mesh.NDim() {
		return fmt.Errorf("%w: spec %s has %d placements for the %d-D mesh %s", ErrInvalid, s, len(s.Placements), s.Mesh.NDim(), s.Mesh)
	}
	for i, n := range s.Shape {
		if n < 0 {
			return fmt.Errorf("%w: spec %s: dim %d has negative size", ErrInvalid, s, i)
		}
	}
	if len(s.Shape) > MaxTensorDims {
		return fmt.Errorf("%w: shape %s has %d dims, more than the %d a tensor may have",
			ErrTooLarge, FormatShape(s.Shape), len(s.Shape), MaxTensorDims)
	}
	if !withinBounds(s.Shape) {
		return fmt.Errorf("%w: shape %s holds more than %d elements, the most a tensor may hold",
			ErrTooLarge, FormatShape(s.Shape), int64(MaxElems))
	}
	var op *ReduceOp
	for i, p := range s.Placements {
		switch p := p.(type) {
		case Shard:
			if p.Dim < 0 || p.Dim >= len(s.Shape) {
				return fmt.Errorf("%w: spec %s: mesh dim %d shards tensor dim %d of a %d-D tensor", ErrInvalid, s, i, p.Dim, len(s.Shape))
			}
			if p.Split > Chunk {
				return fmt.Errorf("%w: spec %s: unknown split", ErrInvalid, s)
			}
		case Partial:
			if p.Op > Min {
				return fmt.Errorf("%w: spec %s: unknown reduce op", ErrInvalid, s)
			}
			if op != nil && *op != p.Op {
				return fmt.Errorf("%w: spec %s mixes P(%s) and P(%s)", ErrInvalid, s, *op, p.Op)
			}
			op = &p.Op
		case Replicate:
		default:
			return fmt.Errorf("%w: spec %s: unknown placement %T", ErrInvalid, s, p)
		}
	}
	return nil
}

// withinBounds reports whether shape (its dims not negative) holds at most
// MaxElems elements and no dim longer than that.
func withinBounds(shape []int) bool {
	n := int64(1)
	for _, d := range shape {
		if d > MaxElems {
			return false
		}
		var ok bool
		if n, ok = MulSize(n, int64(d)); !ok || n > MaxElems {
			return false
		}
	}
	return true
}

// String renders "8x16:[S(0),R]" (the mesh is not included).
func (s Spec) String() string {
	return FormatShape(s.Shape) + ":" + FormatList(s.Placements)
}

// FormatShape renders "8x16"; a scalar renders as "()".
func FormatShape(shape []int) string {
	if len(shape) == 0 {
		return "()"
	}
	parts := make([]string, len(shape))
	for i, n := range shape {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, "x")
}

// ParseShape reads "8x16" or "()" for a scalar. Sizes may be 0.
func ParseShape(s string) ([]int, error) {
	if s == "()" {
		return []int{}, nil
	}
	var out []int
	for _, part := range strings.Split(s, "x") {
		if part == "0" {
			out = append(out, 0)
			continue
		}
		n, err := parseSize(part, MaxElems)
		if err != nil {
			return nil, fmt.Errorf("%w in shape %q", err, s)
		}
		out = append(out, n)
	}
	return out, nil
}

// ParseSpec reads "8x16:[S(0),R]" against a mesh.
func ParseSpec(s string, mesh Mesh) (Spec, error) {
	shape, pls, ok := strings.Cut(s, ":")
	if !ok {
		return Spec{}, fmt.Errorf("%w: spec %q: want SHAPE:[PLACEMENTS], e.g. 8x16:[S(0),R]", ErrSyntax, s)
	}
	sh, err := ParseShape(shape)
	if err != nil {
		return Spec{}, err
	}
	ps, err := ParseList(pls)
	if err != nil {
		return Spec{}, err
	}
	return NewSpec(sh, mesh, ps...)
}

// Equal reports whether two specs have the same shape, mesh and placements.
func (s Spec) Equal(o Spec) bool {
	if len(s.Shape) != len(o.Shape) || len(s.Placements) != len(o.Placements) || !s.Mesh.Equal(o.Mesh) {
		return false
	}
	for i := range s.Shape {
		if s.Shape[i] != o.Shape[i] {
			return false
		}
	}
	for i := range s.Placements {
		if s.Placements[i] != o.Placements[i] {
			return false
		}
	}
	return true
}

// With returns a copy of s with placement p on mesh dim i.
func (s Spec) With(i int, p Placement) Spec {
	ps := append([]Placement(nil), s.Placements...)
	ps[i] = p
	return Spec{Shape: s.Shape, Mesh: s.Mesh, Placements: ps}
}

// WithPlacements returns a copy of s with other placements.
func (s Spec) WithPlacements(ps ...Placement) Spec {
	return Spec{Shape: s.Shape, Mesh: s.Mesh, Placements: append([]Placement(nil), ps...)}
}

// Sharders lists, in nesting order, the mesh dims that shard tensor dim d.
func (s Spec) Sharders(d int) []int {
	var out []int
	for i, p := range s.Placements {
		if sh, ok := p.(Shard); ok && sh.Dim == d {
			out = append(out, i)
		}
	}
	return out
}

// PartialOp returns the spec's pending reduction, if any mesh dim is Partial.
func (s Spec) PartialOp() (ReduceOp, bool) {
	for _, p := range s.Placements {
		if q, ok := p.(Partial); ok {
			return q.Op, true
		}
	}
	return 0, false
}

// NumElems is the number of elements of the global tensor.
func (s Spec) NumElems() int64 { return numElems(s.Shape) }

func numElems(shape []int) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= int64(d)
	}
	return n
}

// Local returns the shape and offset (in the global tensor) of rank's shard.
func (s Spec) Local(rank int) (shape, offset []int) {
	coords := s.Mesh.Coords(rank)
	shape = append([]int(nil), s.Shape...)
	offset = make([]int, len(s.Shape))
	for i, p := range s.Placements {
		sh, ok := p.(Shard)
		if !ok {
			continue
		}
		off, n := ShardRange(shape[sh.Dim], s.Mesh.Dim(i), coords[i], sh.Split)
		offset[sh.Dim] += off
		shape[sh.Dim] = n
	}
	return shape, offset
}

// localInto is Local without allocating: it appends rank's shape and offset
// to shape[:0] and offset[:0] and returns them.
func (s Spec) localInto(rank int, shape, offset []int) ([]int, []int) {
	shape = append(shape[:0], s.Shape...)
	offset = offset[:0]
	for range s.Shape {
		offset = append(offset, 0)
	}
	stride := s.Mesh.Size()
	for i, p := range s.Placements {
		n := s.Mesh.Dim(i)
		stride /= n
		if sh, ok := p.(Shard); ok {
			off, size := ShardRange(shape[sh.Dim], n, (rank/stride)%n, sh.Split)
			offset[sh.Dim] += off
			shape[sh.Dim] = size
		}
	}
	return shape, offset
}

// AppendLocalShape appends the shape of rank's shard to dst and returns it:
// LocalShape without allocating when dst has room.
func (s Spec) AppendLocalShape(dst []int, rank int) []int {
	var buf [MaxTensorDims]int
	off := buf[:0]
	if len(s.Shape) > len(buf) {
		off = nil
	}
	n := len(dst)
	dst = append(dst, s.Shape...)
	s.localInto(rank, dst[n:], off) // in place: dst[n:] has room
	return dst
}

// LocalBox is rank's shard as a box of the global tensor.
func (s Spec) LocalBox(rank int) tensor.Box {
	shape, off := s.Local(rank)
	return tensor.Box{Offset: off, Shape: shape}
}

// LocalShape is the shape of rank's shard.
func (s Spec) LocalShape(rank int) []int {
	shape, _ := s.Local(rank)
	return shape
}

// LocalElems is the number of elements in rank's shard.
func (s Spec) LocalElems(rank int) int64 { return s.localElems(rank) }

// uniform reports whether every rank holds a shard of the same shape: each
// mesh dim that shards a tensor dim divides what the mesh dims before it
// left of that dim.
func (s Spec) uniform() bool {
	var buf [MaxTensorDims]int
	shape := buf[:0]
	if len(s.Shape) > len(buf) {
		shape = make([]int, 0, len(s.Shape))
	}
	shape = append(shape, s.Shape...)
	for i, p := range s.Placements {
		if sh, ok := p.(Shard); ok {
			n := s.Mesh.Dim(i)
			if shape[sh.Dim]%n != 0 {
				return false
			}
			shape[sh.Dim] /= n
		}
	}
	return true
}

// localElems computes LocalElems without allocating.
func (s Spec) localElems(rank int) int64 {
	var buf [MaxTensorDims]int
	shape := buf[:0]
	if len(s.Shape) > len(buf) {
		shape = make([]int, 0, len(s.Shape))
	}
	shape = append(shape, s.Shape...)
	stride := s.Mesh.Size()
	for i, p := range s.Placements {
		n := s.Mesh.Dim(i)
		stride /= n
		if sh, ok := p.(Shard); ok {
			_, shape[sh.Dim] = ShardRange(shape[sh.Dim], n, (rank/stride)%n, sh.Split)
		}
	}
	return numElems(shape)
}

// Owner reports whether rank holds the value when a replicated tensor becomes
// Partial(sum) along mesh dim i: the rank at coordinate 0 keeps it, the others
// hold zeros, so the sum is exact (never a division by the group size).
func (s Spec) Owner(rank, i int) bool { return s.Mesh.Coords(rank)[i] == 0 }
