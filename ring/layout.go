// Package ring runs attention whose sequence is split over the ranks of a
// context-parallel group (cp): ring attention. Each rank keeps its queries
// and passes its keys and values around the ring, one block per step,
// while it computes the attention of its queries with the block it holds;
// partial outputs are merged by their log-sum-exp. The backward passes the
// keys and values again with their partial gradients, and sends the
// gradients home at the end. No rank ever holds more than two blocks of K
// and V: O(S/cp) memory where gathering the sequence takes O(S).
//
// With causal attention a contiguous split leaves the first ranks little to
// do (their queries see few keys); the zigzag layout gives rank i the
// chunks i and 2·cp−1−i of 2·cp chunks, so every rank does the same work.
package ring

import (
	"errors"
	"fmt"

	"github.com/meshrun/meshrun/placement"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrLayout: a sequence that cannot be split as asked (zigzag needs at
	// least 2·cp tokens).
	ErrLayout = errors.New("ring: sequence does not fit the layout")
	// ErrShape: tensors that do not fit the rank's share of the sequence.
	ErrShape = errors.New("ring: shapes do not fit")
)

// Layout is how the sequence is split over the cp ranks.
type Layout uint8

const (
	// Contiguous gives rank i the i-th of cp consecutive chunks.
	Contiguous Layout = iota
	// Zigzag gives rank i the chunks i and 2·cp−1−i of 2·cp chunks.
	Zigzag
)

func (l Layout) String() string {
	if l == Zigzag {
		return "zigzag"
	}
	return "contiguous"
}

// ParseLayout reads "contiguous" or "zigzag".
func ParseLayout(s string) (Layout, error) {
	switch s {
	case "contiguous":
		return Contiguous, nil
	case "zigzag":
		return Zigzag, nil
	}
	return 0, fmt.Errorf("%w: layout %q (contiguous or zigzag)", ErrLayout, s)
}

// Chunk is a run of the sequence's positions: chunk number Index (of all
// the chunks, in sequence order), positions [Start, Start+Len).
type Chunk struct{ Index, Start, Len int }

// Chunks lists, for a sequence of s positions split over cp ranks by
// layout, each rank's chunks in the order the rank holds them. Chunk sizes
// come from placement.ShardRange (balanced: they differ by one at most).
func Chunks(s, cp int, l Layout) ([][]Chunk, error) {
	if cp < 1 {
		return nil, fmt.Errorf("%w: cp = %d", ErrLayout, cp)
	}
	n := cp
	if l == Zigzag {
		n = 2 * cp
		if s < n {
			return nil, fmt.Errorf("%w: a sequence of %d positions in zigzag over cp = %d needs at least 2·cp = %d", ErrLayout, s, cp, n)
		}
	}
	all := make([]Chunk, n)
	for i := range all {
		off, size := placement.ShardRange(s, n, i, placement.Balanced)
		all[i] = Chunk{Index: i, Start: off, Len: size}
	}
	out := make([][]Chunk, cp)
	for r := range out {
		if l == Zigzag {
			out[r] = []Chunk{all[r], all[2*cp-1-r]}
		} else {
			out[r] = []Chunk{all[r]}
		}
	}
	return out, nil
}

// Positions lists the sequence positions a rank holds, in its order (its
// chunks one after the other): the permutation applied to the tokens (and
// their position ids) at the embedding, and undone where the whole sequence
// is needed again.
func Positions(chunks []Chunk) []int {
	var out []int
	for _, c := range chunks {
		for p := range c.Len {
			out = append(out, c.Start+p)
		}
	}
	return out
}

// Len is how many positions chunks hold.
func Len(chunks []Chunk) int {
	n := 0
	for _, c := range chunks {
		n += c.Len
	}
	return n
}
