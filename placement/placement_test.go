package placement

import (
	"errors"
	"slices"
	"testing"
)

func TestParseMesh(t *testing.T) {
	for _, tc := range []struct {
		in    string
		shape []int
		names []string
		err   error
	}{
		{"4", []int{4}, nil, nil},
		{"2x3", []int{2, 3}, nil, nil},
		{"dp=2,tp=2", []int{2, 2}, []string{"dp", "tp"}, nil},
		{"tp=4", []int{4}, []string{"tp"}, nil},
		{"", nil, nil, ErrSyntax},
		{"0", nil, nil, ErrSyntax},
		{"04", nil, nil, ErrSyntax},
		{"dp=2,dp=2", nil, nil, ErrInvalid},
		{"dp=2,2", nil, nil, ErrSyntax},
		{"2x", nil, nil, ErrSyntax},
		{"1dp=2", nil, nil, ErrInvalid},
	} {
		t.Run(tc.in, func(t *testing.T) {
			m, err := ParseMesh(tc.in)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("ParseMesh(%q) error = %v, want %v", tc.in, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(m.Shape(), tc.shape) || !slices.Equal(m.Names(), tc.names) {
				t.Fatalf("got %v %v", m.Shape(), m.Names())
			}
			if m.String() != tc.in {
				t.Fatalf("String() = %q, want %q", m.String(), tc.in)
			}
		})
	}
}

func TestMeshCoordsAndGroups(t *testing.T) {
	m := MustMesh([]int{2, 3}, []string{"dp", "tp"})
	for r := 0; r < m.Size(); r++ {
		if got := m.Rank(m.Coords(r)); got != r {
			t.Fatalf("Rank(Coords(%d)) = %d", r, got)
		}
	}
	if got := m.Coords(4); !slices.Equal(got, []int{1, 1}) {
		t.Fatalf("Coords(4) = %v", got)
	}
	if got := m.Group(4, 1); !slices.Equal(got, []int{3, 4, 5}) {
		t.Fatalf("tp group of 4 = %v", got)
	}
	if got := m.Group(4, 0); !slices.Equal(got, []int{1, 4}) {
		t.Fatalf("dp group of 4 = %v", got)
	}
	if got := m.Group(4, 0, 1); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5}) {
		t.Fatalf("flattened group = %v", got)
	}
	if got := m.Group(4, 1, 0); !slices.Equal(got, []int{0, 3, 1, 4, 2, 5}) {
		t.Fatalf("flattened (tp,dp) group = %v", got)
	}
	if got := m.GroupIndex(4, 1, 0); got != 3 {
		t.Fatalf("GroupIndex = %d", got)
	}
	if got := m.Groups(0); len(got) != 3 || !slices.Equal(got[2], []int{2, 5}) {
		t.Fatalf("Groups(dp) = %v", got)
	}
	if err := m.Validate(4); !errors.Is(err, ErrWorldSize) {
		t.Fatalf("Validate(4) = %v", err)
	}
	if i, err := m.DimIndex("tp"); err != nil || i != 1 {
		t.Fatalf("DimIndex(tp) = %d, %v", i, err)
	}
}

func TestParsePlacement(t *testing.T) {
	good := map[string]Placement{
		"R": Replicate{}, "P": Partial{Sum}, "P(avg)": Partial{Avg}, "P(max)": Partial{Max},
		"P(min)": Partial{Min}, "S(0)": Shard{Dim: 0}, "S(12)": Shard{Dim: 12},
		"S(1,chunk)": Shard{Dim: 1, Split: Chunk},
	}
	for s, want := range good {
		p, err := Parse(s)
		if err != nil || p != want || p.String() != s {
			t.Errorf("Parse(%q) = %v, %v; want %v", s, p, err, want)
		}
	}
	for _, s := range []string{"", "S", "S()", "S(-1)", "S(01)", "S(0,balanced)", "P(sum)", "P(prod)", "r", "S(1", "R "} {
		if _, err := Parse(s); !errors.Is(err, ErrSyntax) {
			t.Errorf("Parse(%q) error = %v, want ErrSyntax", s, err)
		}
	}
	ps, err := ParseList("[S(0,chunk),P(avg),R]")
	if err != nil || FormatList(ps) != "[S(0,chunk),P(avg),R]" {
		t.Fatalf("ParseList = %v, %v", ps, err)
	}
	if ps, err := ParseList("S(1)"); err != nil || len(ps) != 1 {
		t.Fatalf("bare placement: %v %v", ps, err)
	}
}

func TestShardRange(t *testing.T) {
	for _, tc := range []struct {
		n, p  int
		split Split
		sizes []int
	}{
		{10, 4, Balanced, []int{3, 3, 2, 2}},
		{10, 4, Chunk, []int{3, 3, 3, 1}},
		{5, 4, Chunk, []int{2, 2, 1, 0}},
		{3, 4, Balanced, []int{1, 1, 1, 0}},
		{2, 3, Chunk, []int{1, 1, 0}},
		{0, 3, Balanced, []int{0, 0, 0}},
		{7, 3, Balanced, []int{3, 2, 2}},
		{4, 3, Chunk, []int{2, 2, 0}},
	} {
		off := 0
		for r, want := range tc.sizes {
			o, n := ShardRange(tc.n, tc.p, r, tc.split)
			if n != want || o != off {
				t.Errorf("ShardRange(%d,%d,%d,%d) = (%d,%d), want (%d,%d)", tc.n, tc.p, r, tc.split, o, n, off, want)
			}
			off += n
		}
		if off != tc.n {
			t.Errorf("shards of %d sum to %d", tc.n, off)
		}
	}
}

func TestNestedShard(t *testing.T) {
	m := MustMesh([]int{2, 2}, []string{"dp", "tp"})
	s := MustSpec([]int{7, 3}, m, Shard{Dim: 0}, Shard{Dim: 0})
	// dp splits 7 into 4+3, tp splits each again: 2+2, 2+1.
	want := [][2]int{{0, 2}, {2, 2}, {4, 2}, {6, 1}}
	for r, w := range want {
		shape, off := s.Local(r)
		if off[0] != w[0] || shape[0] != w[1] || shape[1] != 3 {
			t.Errorf("rank %d: shape %v offset %v, want rows %v", r, shape, off, w)
		}
	}
}

func TestSpecValidate(t *testing.T) {
	m := MustMesh([]int{2, 2}, nil)
	for name, ps := range map[string][]Placement{
		"too few":     {Replicate{}},
		"dim too big": {Shard{Dim: 2}, Replicate{}},
		"mixed ops":   {Partial{Sum}, Partial{Max}},
	} {
		if _, err := NewSpec([]int{4, 4}, m, ps...); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := ParseSpec("8x16", m); !errors.Is(err, ErrSyntax) {
		t.Errorf("missing placements: %v", err)
	}
	s, err := ParseSpec("8x0:[S(1),P(max)]", m)
	if err != nil || s.String() != "8x0:[S(1),P(max)]" {
		t.Errorf("ParseSpec = %v, %v", s, err)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"R", "P", "P(avg)", "S(0)", "S(3,chunk)", "S(", "P(x)"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Parse(s)
		if err != nil {
			return
		}
		if p.String() != s {
			t.Fatalf("Parse(%q).String() = %q", s, p.String())
		}
		q, err := Parse(p.String())
		if err != nil || q != p {
			t.Fatalf("round trip of %v: %v, %v", p, q, err)
		}
	})
}

func FuzzParseMesh(f *testing.F) {
	for _, s := range []string{"4", "2x2", "dp=2,tp=2", "a=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMesh(s)
		if err != nil {
			return
		}
		if m.String() != s {
			t.Fatalf("ParseMesh(%q).String() = %q", s, m.String())
		}
	})
}

func TestLocalElemsMatchesLocal(t *testing.T) {
	m := MustMesh([]int{2, 3, 2}, nil)
	s := MustSpec([]int{7, 5, 3}, m, Shard{Dim: 0}, Shard{Dim: 0, Split: Chunk}, Shard{Dim: 2})
	for r := 0; r < m.Size(); r++ {
		shape := s.LocalShape(r)
		if got, want := s.LocalElems(r), int64(shape[0]*shape[1]*shape[2]); got != want {
			t.Fatalf("rank %d: LocalElems %d, shape %v", r, got, shape)
		}
	}
}
