package placement

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/meshrun/meshrun/tensor"
)

// Placement says how a tensor is laid out along one mesh dim: Shard, Replicate or
// Partial. Placements are comparable values: p == q means the same layout.
type Placement interface {
	// String renders the placement as Parse reads it: S(0), S(1,chunk), R, P,
	// P(avg), P(max), P(min).
	String() string
	isPlacement()
}

// Split decides how a sharded dim of length L is cut into P pieces.
type Split uint8

const (
	// Balanced gives rank r floor(L/P) + (r < L mod P ? 1 : 0) elements: no shard
	// is empty while L >= P. The default.
	Balanced Split = iota
	// Chunk gives each rank ceil(L/P) elements and the trailing ranks what is left,
	// possibly nothing, as torch.chunk and PyTorch DTensor do.
	Chunk
)

// ReduceOp is the pending reduction of a Partial tensor (tensor's type, which
// collectives apply).
type ReduceOp = tensor.ReduceOp

// The reductions.
const (
	Sum = tensor.Sum
	Avg = tensor.Avg
	Max = tensor.Max
	Min = tensor.Min
)

// ParseReduceOp reads sum, avg, max or min.
func ParseReduceOp(s string) (ReduceOp, error) {
	for op := Sum; op <= Min; op++ {
		if op.String() == s {
			return op, nil
		}
	}
	return 0, fmt.Errorf("%w: reduce op %q: want sum, avg, max or min", ErrSyntax, s)
}

// Shard splits tensor dim Dim across the ranks of the mesh dim.
type Shard struct {
	Dim   int
	Split Split
}

// Replicate holds the whole tensor (along this mesh dim) on every rank.
type Replicate struct{}

// Partial holds on each rank a term of a pending reduction: the tensor is the
// reduction by Op of the ranks' local tensors.
type Partial struct {
	Op ReduceOp
}

func (Shard) isPlacement()     {}
func (Replicate) isPlacement() {}
func (Partial) isPlacement()   {}

func (s Shard) String() string {
	if s.Split == Chunk {
		return "S(" + strconv.Itoa(s.Dim) + ",chunk)"
	}
	return "S(" + strconv.Itoa(s.Dim) + ")"
}

func (Replicate) String() string { return "R" }

func (p Partial) String() string {
	if p.Op == Sum {
		return "P"
	}
	return "P(" + p.Op.String() + ")"
}

// Parse reads one placement in the canonical form String writes: S(d), S(d,chunk),
// R, P, P(avg), P(max), P(min). Parse and String are exact inverses: any string
// Parse accepts is rendered back unchanged.
func Parse(s string) (Placement, error) {
	switch {
	case s == "R":
		return Replicate{}, nil
	case s == "P":
		return Partial{Op: Sum}, nil
	case strings.HasPrefix(s, "P(") && strings.HasSuffix(s, ")"):
		op, err := ParseReduceOp(s[2 : len(s)-1])
		if err != nil {
			return nil, fmt.Errorf("%w in %q", err, s)
		}
		if op == Sum {
			return nil, fmt.Errorf("%w: %q: write P for a sum", ErrSyntax, s)
		}
		return Partial{Op: op}, nil
	case strings.HasPrefix(s, "S(") && strings.HasSuffix(s, ")"):
		body := s[2 : len(s)-1]
		split := Balanced
		if d, opt, ok := strings.Cut(body, ","); ok {
			if opt != "chunk" {
				return nil, fmt.Errorf("%w: %q: split %q: want chunk (balanced is the default)", ErrSyntax, s, opt)
			}
			body, split = d, Chunk
		}
		if body == "" || (len(body) > 1 && body[0] == '0') || body[0] < '0' || body[0] > '9' {
			return nil, fmt.Errorf("%w: %q: shard dim must be a non-negative integer", ErrSyntax, s)
		}
		d, err := strconv.Atoi(body)
		if err != nil || d > 1<<16 {
			return nil, fmt.Errorf("%w: %q: shard dim must be a non-negative integer", ErrSyntax, s)
		}
		return Shard{Dim: d, Split: split}, nil
	}
	return nil, fmt.Errorf("%w: %q: want S(d), S(d,chunk), R, P or P(avg|max|min)", ErrSyntax, s)
}

// MustParse is Parse that panics on error, for tests and literals.
func MustParse(s string) Placement {
	p, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return p
}

// ParseList reads "[S(0),R]", one placement per mesh dim. A single placement
// without brackets ("S(0)") is accepted for a 1-D mesh. An empty list "[]" is
// valid (a 0-D mesh never occurs, but the syntax round-trips).
func ParseList(s string) ([]Placement, error) {
	body := s
	if strings.HasPrefix(s, "[") {
		if !strings.HasSuffix(s, "]") {
			return nil, fmt.Errorf("%w: %q: missing ]", ErrSyntax, s)
		}
		body = s[1 : len(s)-1]
	}
	if body == "" {
		if s == "[]" {
			return []Placement{}, nil
		}
		return nil, fmt.Errorf("%w: empty placement list", ErrSyntax)
	}
	// Split on commas outside parentheses.
	var out []Placement
	depth, start := 0, 0
	for i := 0; i <= len(body); i++ {
		if i < len(body) {
			switch body[i] {
			case '(':
				depth++
				continue
			case ')':
				depth--
				continue
			case ',':
				if depth > 0 {
					continue
				}
			default:
				continue
			}
		}
		p, err := Parse(body[start:i])
		if err != nil {
			return nil, err
		}
		out = append(out, p)
		start = i + 1
	}
	return out, nil
}

// FormatList renders placements as "[S(0),R]", the form ParseList reads.
func FormatList(ps []Placement) string { return string(appendList(nil, ps)) }

// appendList appends FormatList(ps) to b.
func appendList(b []byte, ps []Placement) []byte {
	b = append(b, '[')
	for i, p := range ps {
		if i > 0 {
			b = append(b, ',')
		}
		switch p := p.(type) {
		case Shard:
			b = append(b, "S("...)
			b = strconv.AppendInt(b, int64(p.Dim), 10)
			if p.Split == Chunk {
				b = append(b, ",chunk"...)
			}
			b = append(b, ')')
		default:
			b = append(b, p.String()...)
		}
	}
	return append(b, ']')
}

// IsShard, IsReplicate and IsPartial test a placement's kind.
func IsShard(p Placement) (Shard, bool)     { s, ok := p.(Shard); return s, ok }
func IsReplicate(p Placement) bool          { _, ok := p.(Replicate); return ok }
func IsPartial(p Placement) (Partial, bool) { q, ok := p.(Partial); return q, ok }
