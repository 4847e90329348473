package placement

import (
	"fmt"
	"strconv"
	"strings"
)

// Mesh is an N-D grid of ranks. Rank r has coordinates in row-major order: the
// last dim varies fastest. Dims may be named ("dp", "tp"); a mesh built from "4"
// or "2x2" has no names. The zero Mesh is invalid; build one with NewMesh or
// ParseMesh.
type Mesh struct {
	shape []int
	names []string // nil or one per dim
}

// NewMesh builds a mesh. names is nil or holds one distinct, non-empty name per dim.
func NewMesh(shape []int, names []string) (Mesh, error) {
	if len(shape) == 0 {
		return Mesh{}, fmt.Errorf("%w: mesh has no dims", ErrInvalid)
	}
	for i, n := range shape {
		if n < 1 {
			return Mesh{}, fmt.Errorf("%w: mesh dim %d has size %d", ErrInvalid, i, n)
		}
	}
	if len(shape) > MaxMeshDims {
		return Mesh{}, fmt.Errorf("%w: mesh %s has %d dims, more than the %d a mesh may have",
			ErrTooLarge, FormatShape(shape), len(shape), MaxMeshDims)
	}
	size := 1
	for _, n := range shape {
		if n > MaxDevices/size {
			return Mesh{}, fmt.Errorf("%w: mesh %s holds more than %d devices, the most a mesh may hold",
				ErrTooLarge, FormatShape(shape), MaxDevices)
		}
		size *= n
	}
	if names != nil {
		if len(names) != len(shape) {
			return Mesh{}, fmt.Errorf("%w: mesh has %d dims but %d names", ErrInvalid, len(shape), len(names))
		}
		seen := map[string]bool{}
		for _, nm := range names {
			if !validName(nm) {
				return Mesh{}, fmt.Errorf("%w: mesh dim name %q: want letters, digits and _ starting with a letter", ErrInvalid, nm)
			}
			if seen[nm] {
				return Mesh{}, fmt.Errorf("%w: mesh dim name %q appears twice", ErrInvalid, nm)
			}
			seen[nm] = true
		}
		names = append([]string(nil), names...)
	}
	return Mesh{shape: append([]int(nil), shape...), names: names}, nil
}

// MustMesh is NewMesh that panics on error, for tests and literals.
func MustMesh(shape []int, names []string) Mesh {
	m, err := NewMesh(shape, names)
	if err != nil {
		panic(err)
	}
	return m
}

func validName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '_':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// ParseMesh reads "4", "2x2" (unnamed) or "dp=2,tp=2" (named). It is the inverse
// of String.
func ParseMesh(s string) (Mesh, error) {
	if s == "" {
		return Mesh{}, fmt.Errorf("%w: empty mesh", ErrSyntax)
	}
	if strings.Contains(s, "=") {
		var shape []int
		var names []string
		for _, part := range strings.Split(s, ",") {
			name, size, ok := strings.Cut(part, "=")
			if !ok {
				return Mesh{}, fmt.Errorf("%w: mesh %q: %q is not name=size", ErrSyntax, s, part)
			}
			n, err := parseSize(size, MaxDevices)
			if err != nil {
				return Mesh{}, fmt.Errorf("%w in mesh %q", err, s)
			}
			shape = append(shape, n)
			names = append(names, name)
		}
		return NewMesh(shape, names)
	}
	var shape []int
	for _, part := range strings.Split(s, "x") {
		n, err := parseSize(part, MaxDevices)
		if err != nil {
			return Mesh{}, fmt.Errorf("%w in mesh %q", err, s)
		}
		shape = append(shape, n)
	}
	return NewMesh(shape, nil)
}

// parseSize reads a positive decimal integer with no sign and no leading zero,
// at most limit.
func parseSize(s string, limit int) (int, error) {
	if s == "" || s[0] == '0' {
		return 0, fmt.Errorf("%w: size %q", ErrSyntax, s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%w: size %q", ErrSyntax, s)
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > limit {
		return 0, fmt.Errorf("%w: size %s is more than %d", ErrTooLarge, s, limit)
	}
	return n, nil
}

// String renders the mesh as ParseMesh reads it.
func (m Mesh) String() string {
	var b strings.Builder
	for i, n := range m.shape {
		if m.names != nil {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(m.names[i])
			b.WriteByte('=')
		} else if i > 0 {
			b.WriteByte('x')
		}
		b.WriteString(strconv.Itoa(n))
	}
	return b.String()
}

// NDim is the number of mesh dims.
func (m Mesh) NDim() int { return len(m.shape) }

// Size is the number of ranks, at most MaxDevices.
func (m Mesh) Size() int {
	if len(m.shape) == 0 {
		return 0
	}
	n := 1
	for _, d := range m.shape {
		n *= d
	}
	return n
}

// Shape returns a copy of the mesh shape.
func (m Mesh) Shape() []int { return append([]int(nil), m.shape...) }

// Dim is the size of mesh dim i.
func (m Mesh) Dim(i int) int { return m.shape[i] }

// Names returns a copy of the dim names, or nil for an unnamed mesh.
func (m Mesh) Names() []string { return append([]string(nil), m.names...) }

// DimName is the name of mesh dim i: its given name, or "d<i>" when unnamed.
func (m Mesh) DimName(i int) string {
	if m.names != nil {
		return m.names[i]
	}
	return "d" + strconv.Itoa(i)
}

// DimIndex finds a mesh dim by name ("tp") or by index ("1").
func (m Mesh) DimIndex(name string) (int, error) {
	for i := range m.shape {
		if m.DimName(i) == name {
			return i, nil
		}
	}
	if i, err := strconv.Atoi(name); err == nil && i >= 0 && i < len(m.shape) {
		return i, nil
	}
	return -1, fmt.Errorf("%w: mesh %s has no dim %q", ErrInvalid, m, name)
}

// Equal reports whether two meshes have the same shape and names.
func (m Mesh) Equal(o Mesh) bool { return m.String() == o.String() }

// Validate checks that the mesh holds exactly world ranks.
func (m Mesh) Validate(world int) error {
	if m.Size() != world {
		return fmt.Errorf("%w: mesh %s holds %d ranks, world size is %d", ErrWorldSize, m, m.Size(), world)
	}
	return nil
}

// Coords returns rank's coordinates (row-major, last dim fastest).
func (m Mesh) Coords(rank int) []int {
	if rank < 0 || rank >= m.Size() {
		panic(fmt.Sprintf("placement: rank %d outside mesh %s", rank, m))
	}
	c := make([]int, len(m.shape))
	for i := len(m.shape) - 1; i >= 0; i-- {
		c[i] = rank % m.shape[i]
		rank /= m.shape[i]
	}
	return c
}

// Rank is the inverse of Coords.
func (m Mesh) Rank(coords []int) int {
	if len(coords) != len(m.shape) {
		panic(fmt.Sprintf("placement: %d coords for mesh %s", len(coords), m))
	}
	r := 0
	for i, c := range coords {
		if c < 0 || c >= m.shape[i] {
			panic(fmt.Sprintf("placement: coord %d outside mesh dim %d of %s", c, i, m))
		}
		r = r*m.shape[i] + c
	}
	return r
}

// Group returns the ranks that share rank's coordinates on every mesh dim except
// dims, ordered row-major over dims in the order given (the first dim given varies
// slowest). The group of a flattened set of dims {i, j} thus orders ranks the way
// a tensor dim sharded by mesh dims i then j is nested. Group(rank) with no dims
// is {rank}.
func (m Mesh) Group(rank int, dims ...int) []int {
	base := m.Coords(rank)
	size := 1
	for _, d := range dims {
		size *= m.shape[d]
	}
	out := make([]int, size)
	c := append([]int(nil), base...)
	for k := 0; k < size; k++ {
		rem := k
		for i := len(dims) - 1; i >= 0; i-- {
			d := dims[i]
			c[d] = rem % m.shape[d]
			rem /= m.shape[d]
		}
		out[k] = m.Rank(c)
	}
	return out
}

// GroupIndex is rank's position within Group(rank, dims...).
func (m Mesh) GroupIndex(rank int, dims ...int) int {
	c := m.Coords(rank)
	k := 0
	for _, d := range dims {
		k = k*m.shape[d] + c[d]
	}
	return k
}

// ring returns, without allocating, rank's position k in Group(rank, dims...),
// the group's size p, and the rank at position (k+1) mod p: its successor on
// a ring over the group.
func (m Mesh) ring(rank int, dims []int) (k, p, next int) {
	var buf [MaxMeshDims]int
	c := buf[:len(m.shape)]
	for i, rem := len(m.shape)-1, rank; i >= 0; i-- {
		c[i] = rem % m.shape[i]
		rem /= m.shape[i]
	}
	p = 1
	for _, d := range dims {
		k = k*m.shape[d] + c[d]
		p *= m.shape[d]
	}
	for i, n := len(dims)-1, (k+1)%p; i >= 0; i-- {
		d := dims[i]
		c[d] = n % m.shape[d]
		n /= m.shape[d]
	}
	for i, x := range c {
		next = next*m.shape[i] + x
	}
	return k, p, next
}

// Groups returns every group along dims, each ordered as Group orders it, the
// groups ordered by their smallest rank.
func (m Mesh) Groups(dims ...int) [][]int {
	var out [][]int
	seen := make([]bool, m.Size())
	for r := 0; r < m.Size(); r++ {
		if seen[r] {
			continue
		}
		g := m.Group(r, dims...)
		for _, x := range g {
			seen[x] = true
		}
		out = append(out, g)
	}
	return out
}

// SplitDim splits mesh into the size of its dim named name and the mesh of
// the other dims, in order (a mesh of that dim alone leaves one rank, named
// tp). ok is false when mesh has no such dim. A pipeline's mesh pp=P,tp=N
// is P stages of the mesh tp=N.
func SplitDim(mesh Mesh, name string) (size int, rest Mesh, ok bool, err error) {
	i, err := mesh.DimIndex(name)
	if err != nil || mesh.Names() == nil {
		return 0, mesh, false, nil
	}
	var shape []int
	var names []string
	for d := 0; d < mesh.NDim(); d++ {
		if d != i {
			shape, names = append(shape, mesh.Dim(d)), append(names, mesh.DimName(d))
		}
	}
	if shape == nil {
		shape, names = []int{1}, []string{"tp"}
	}
	rest, err = NewMesh(shape, names)
	return mesh.Dim(i), rest, true, err
}
