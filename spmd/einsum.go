package spmd

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meshrun/meshrun/placement"
)

// bcast marks a dim of size 1 broadcast against a larger one: it carries no
// letter, is never sharded, and in an output it holds the sum over the letter it
// stands for.
const bcast = '1'

// einsum is an equation with "..." expanded: one byte per dim, lower case from
// the equation, upper case for the batch dims "..." stands for, bcast for a
// broadcast size-1 dim.
type einsum struct {
	in   []string
	out  string
	size map[byte]int
}

func (e einsum) String() string { return strings.Join(e.in, ",") + "->" + e.out }

// expand reads an equation such as "...mk,...kn->...mn" against the input shapes.
// Batch dims stand right-aligned; a term with fewer of them is broadcast, and a
// batch dim of size 1 against a larger one becomes bcast.
func expand(eq string, shapes [][]int) (einsum, error) {
	lhs, out, ok := strings.Cut(eq, "->")
	if !ok {
		return einsum{}, fmt.Errorf("equation %q has no ->", eq)
	}
	terms := strings.Split(lhs, ",")
	if len(terms) != len(shapes) {
		return einsum{}, fmt.Errorf("equation %q takes %d inputs, got %d", eq, len(terms), len(shapes))
	}
	batch := 0
	for i, t := range terms {
		explicit := len(strings.ReplaceAll(t, "...", ""))
		if strings.Contains(t, "...") {
			batch = max(batch, len(shapes[i])-explicit)
		} else if explicit != len(shapes[i]) {
			return einsum{}, fmt.Errorf("%w: input %d has %d dims, %q wants %d", ErrShape, i, len(shapes[i]), t, explicit)
		}
	}
	if batch < 0 {
		return einsum{}, fmt.Errorf("%w: too few dims for %q", ErrShape, eq)
	}
	letters := make([]byte, batch)
	for i := range letters {
		letters[i] = byte('A' + i)
	}
	e := einsum{size: map[byte]int{}}
	sub := func(t string, n int) (string, error) {
		if !strings.Contains(t, "...") {
			return t, nil
		}
		nb := n - (len(t) - 3)
		if nb < 0 {
			return "", fmt.Errorf("%w: %q needs at least %d dims, got %d", ErrShape, t, len(t)-3, n)
		}
		return strings.Replace(t, "...", string(letters[batch-nb:]), 1), nil
	}
	for i, t := range terms {
		s, err := sub(t, len(shapes[i]))
		if err != nil {
			return einsum{}, err
		}
		e.in = append(e.in, s)
	}
	o, err := sub(out, batch+len(out)-3)
	if err != nil {
		return einsum{}, err
	}
	e.out = o
	// Sizes: a letter's size is the largest it takes; size 1 broadcasts for batch letters.
	for i, t := range e.in {
		for d := range t {
			l, n := t[d], shapes[i][d]
			if old, ok := e.size[l]; ok && old != n {
				if !isBatch(l) || (old != 1 && n != 1) {
					return einsum{}, fmt.Errorf("%w: %q is %d in one input and %d in another", ErrShape, string(l), old, n)
				}
				n = max(old, n)
			}
			e.size[l] = n
		}
	}
	for i, t := range e.in {
		b := []byte(t)
		for d, l := range b {
			if isBatch(l) && shapes[i][d] == 1 && e.size[l] > 1 {
				b[d] = bcast
			}
		}
		e.in[i] = string(b)
	}
	for _, l := range []byte(e.out) {
		if _, ok := e.size[l]; !ok {
			return einsum{}, fmt.Errorf("output letter %q of %q is in no input", string(l), eq)
		}
	}
	return e, nil
}

func isBatch(l byte) bool { return l >= 'A' && l <= 'Z' }

// shapeOf is the shape of a term.
func (e einsum) shapeOf(t string) []int {
	s := make([]int, len(t))
	for d := range t {
		if t[d] == bcast {
			s[d] = 1
		} else {
			s[d] = e.size[t[d]]
		}
	}
	return s
}

// letters lists the distinct letters of the equation in a fixed order: output
// letters first, then contracted ones.
func (e einsum) letters() []byte {
	var out []byte
	for _, l := range []byte(e.out) {
		if l != bcast && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	for _, t := range e.in {
		for _, l := range []byte(t) {
			if l != bcast && !slices.Contains(out, l) {
				out = append(out, l)
			}
		}
	}
	return out
}

// kind says what an op is linear in, which decides where partial inputs may
// pass through.
type kind struct {
	// linear[i]: the op is linear in input i with the others fixed, so a partial
	// input i (sum or avg) with every other input replicated yields a partial
	// output.
	linear []bool
	// additive: the op is a sum of its inputs, so all inputs partial yield a
	// partial output (a replicated input becomes partial on one owner rank).
	additive bool
	// bias: the last input is added to the output after the einsum of the others
	// and follows the output's placement (exactly once under a partial output).
	bias bool
	// whole: letters no strategy shards, the dims the op needs whole on every
	// rank (the normalized dim of a layer norm, a softmax's dim, attention's
	// sequence and head dims).
	whole string
	// free: letters that do not multiply the op's work (an embedding's
	// vocabulary: a lookup, not a contraction); times: the work is the
	// product of the other letters' sizes times this (0: 1).
	free  string
	times int64
	// reduce is what splitting a contracted letter leaves in the output:
	// partial sums (Sum, the zero value), or partial maxima (amax).
	reduce placement.ReduceOp
	// seq: the letters of an attention's query and key sequences, which
	// ring attention may keep split (ring.go); causal: the keys after a
	// query are masked, so a split sequence is laid out in zigzag.
	seq    string
	causal bool
}

// counts says whether letter l multiplies the op's work.
func (k kind) counts(l byte) bool { return strings.IndexByte(k.free, l) < 0 }

// factor is k.times, 1 when unset.
func (k kind) factor() int64 { return max(k.times, 1) }

// choice is what one mesh dim does in a strategy.
type choice struct {
	what byte // 'R' replicate, 'S' shard letter, 'P' pass a partial input, 'A' all inputs partial,
	// 'C' ring attention, 'G' split queries with keys gathered (ring.go)
	letter byte
	key    byte // 'C', 'G': the keys' letter (letter is the queries')
	input  int
	op     placement.ReduceOp
}

func (c choice) label(e einsum) string {
	switch c.what {
	case 'S':
		if d := strings.IndexByte(e.out, c.letter); d >= 0 {
			return fmt.Sprintf("split output dim %d", d)
		}
		for j, t := range e.in {
			if d := strings.IndexByte(t, c.letter); d >= 0 {
				return fmt.Sprintf("split contracted dim %d of input %d (partial sums)", d, j)
			}
		}
	case 'P':
		return fmt.Sprintf("pass partial input %d through", c.input)
	case 'A':
		return "add partials"
	case 'C':
		return "ring attention (queries, keys and values keep the sequence split)"
	case 'G':
		return "split the queries' sequence, gather the keys and values"
	}
	return "replicate"
}

// candidates lists the choices for mesh dim i, in the fixed order ties go by.
func candidates(e einsum, k kind, given []placement.Spec, i int) []choice {
	out := []choice{{what: 'R'}}
	for _, l := range e.letters() {
		if strings.IndexByte(k.whole, l) < 0 {
			out = append(out, choice{what: 'S', letter: l, op: k.reduce})
		}
	}
	for j, s := range given {
		p, ok := s.Placements[i].(placement.Partial)
		if !ok {
			continue
		}
		if j < len(k.linear) && k.linear[j] && (p.Op == placement.Sum || p.Op == placement.Avg) {
			out = append(out, choice{what: 'P', input: j, op: p.Op})
		}
		if k.additive && (p.Op == placement.Sum || p.Op == placement.Avg) {
			c := choice{what: 'A', op: p.Op}
			if !slices.Contains(out, c) {
				out = append(out, c)
			}
		}
	}
	return out
}

// split is the split a sharded letter uses on mesh dim i: chunk if any input
// already shards it that way there, balanced otherwise.
func split(e einsum, given []placement.Spec, i int, l byte) placement.Split {
	for j, s := range given {
		if j >= len(e.in) {
			break
		}
		if sh, ok := s.Placements[i].(placement.Shard); ok && sh.Dim < len(e.in[j]) && e.in[j][sh.Dim] == l && sh.Split == placement.Chunk {
			return placement.Chunk
		}
	}
	return placement.Balanced
}

// place returns what a term holds on mesh dim i under choice c (isOut: the
// output term, where a contracted letter leaves a partial sum).
func place(e einsum, given []placement.Spec, i int, c choice, term string, isOut bool, input int) placement.Placement {
	switch c.what {
	case 'S':
		if d := strings.IndexByte(term, c.letter); d >= 0 {
			return placement.Shard{Dim: d, Split: split(e, given, i, c.letter)}
		}
		if isOut {
			return placement.Partial{Op: c.op} // Sum but for a max reduction
		}
	case 'P':
		if isOut || input == c.input {
			return placement.Partial{Op: c.op}
		}
	case 'A':
		return placement.Partial{Op: c.op}
	case 'C', 'G':
		if d := strings.IndexByte(term, c.letter); d >= 0 {
			return placement.Shard{Dim: d, Split: split(e, given, i, c.letter)}
		}
		if d := strings.IndexByte(term, c.key); d >= 0 && c.what == 'C' {
			return placement.Shard{Dim: d, Split: split(e, given, i, c.key)}
		}
		if isOut && c.what == 'G' {
			// A gradient of the keys or values sums over split queries.
			return placement.Partial{Op: placement.Sum}
		}
	}
	return placement.Replicate{}
}

// biasPlacement is where a bias added to an output must sit on mesh dim i: a
// partial output takes a partial bias (held by one owner rank, so it is added
// once); an output sharded on a letter the bias has takes the bias sharded alike.
func biasPlacement(outTerm, biasTerm string, out placement.Placement) placement.Placement {
	switch p := out.(type) {
	case placement.Partial:
		return p
	case placement.Shard:
		if d := strings.IndexByte(biasTerm, outTerm[p.Dim]); d >= 0 {
			return placement.Shard{Dim: d, Split: p.Split}
		}
	}
	return placement.Replicate{}
}
