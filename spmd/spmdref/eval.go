// Package spmdref holds the reference implementations of the local ops the
// sharding rules plan, forward and backward, in float64: the worker's verify
// workload (package job) checks the distributed ops against them, and package
// spmd's tests check the rules. It also holds the mixture-of-experts layer's
// reference, forward and backward (moe.go, docs/moe.md). It is production
// code for that one workload: no other package but the worker's links it
// (spmd's TestLayeringReference).
package spmdref

import (
	"fmt"
	"math"
	"slices"
	"strings"

	sim "github.com/meshrun/meshrun/placement/placementref"
)

// bcast marks a broadcast size-1 dim in an expanded equation (as in package spmd).
const bcast = '1'

// Eval computes an op on dense float64 tensors, locally: the reference every
// rule is checked against, applied both to whole tensors and to each rank's
// shards. equation is a plan's (spmd.Plan.Equation: "..." expanded, '1' for a
// broadcast size-1 dim); op names the local op (a rule's, or a backward op's:
// gelu_backward, relu_backward), outShape gives the sizes of output letters no
// input has.
func Eval(op, equation string, ins []sim.Tensor, outShape []int) (sim.Tensor, error) {
	return EvalAt(op, equation, ins, outShape, 0)
}

// EvalAt is Eval for a local op whose table starts at vocabulary row
// rowOffset (the embedding ops on a table sharded by rows: ids outside the
// rank's rows look up zeros, and their gradients go nowhere).
func EvalAt(op, equation string, ins []sim.Tensor, outShape []int, rowOffset int) (sim.Tensor, error) {
	lhs, out, _ := strings.Cut(equation, "->")
	terms := strings.Split(lhs, ",")
	size := map[byte]int{}
	for j, t := range terms {
		if len(t) != len(ins[j].Shape) {
			return sim.Tensor{}, fmt.Errorf("%s: input %d has shape %v for term %q", op, j, ins[j].Shape, t)
		}
		for d := range t {
			if t[d] == bcast {
				continue
			}
			if n, ok := size[t[d]]; ok && n != ins[j].Shape[d] {
				return sim.Tensor{}, fmt.Errorf("%s: local sizes of %q disagree: %d vs %d", op, string(t[d]), n, ins[j].Shape[d])
			}
			size[t[d]] = ins[j].Shape[d]
		}
	}
	// Output letters no input has (a broadcast) take their size from outShape.
	for d := range out {
		if _, ok := size[out[d]]; !ok && out[d] != bcast {
			size[out[d]] = outShape[d]
		}
	}
	oshape := make([]int, len(out))
	for d := range out {
		oshape[d] = 1
		if out[d] != bcast {
			oshape[d] = size[out[d]]
		}
	}
	res := sim.New(oshape...)
	var letters []byte
	for _, t := range append(slices.Clone(terms), out) {
		for _, l := range []byte(t) {
			if l != bcast && !slices.Contains(letters, l) {
				letters = append(letters, l)
			}
		}
	}
	offset := func(t string, shape []int, val map[byte]int) int {
		k := 0
		for d := range t {
			v := 0
			if t[d] != bcast {
				v = val[t[d]]
			}
			k = k*shape[d] + v
		}
		return k
	}
	val := map[byte]int{}
	var visit func(i int, f func())
	visit = func(i int, f func()) {
		if i == len(letters) {
			f()
			return
		}
		for v := 0; v < size[letters[i]]; v++ {
			val[letters[i]] = v
			visit(i+1, f)
		}
	}
	switch {
	case op == "softmax" || op == "softmax_backward":
		if err := softmax(op, out, ins, res); err != nil {
			return sim.Tensor{}, err
		}
	case IsBlockOp(op):
		if err := evalBlocks(op, terms, out, ins, res, size, rowOffset); err != nil {
			return sim.Tensor{}, err
		}
	case op == "amax":
		// The maximum over the letters the output lacks.
		for k := range res.Data {
			res.Data[k] = math.Inf(-1)
		}
		visit(0, func() {
			o := offset(out, oshape, val)
			res.Data[o] = math.Max(res.Data[o], ins[0].Data[offset(terms[0], ins[0].Shape, val)])
		})
	case op == "gelu" || op == "relu":
		for k, x := range ins[0].Data {
			res.Data[k] = UnaryF(op, x)
		}
	case strings.HasSuffix(op, "_backward"):
		for k := range res.Data {
			res.Data[k] = ins[0].Data[k] * UnaryGrad(strings.TrimSuffix(op, "_backward"), ins[1].Data[k])
		}
	case op == "add" || len(ins) == 1:
		// Sum form: each input broadcast to the output, summed over its letters the
		// output lacks.
		for j, t := range terms {
			// Visit only the letters of this term and the output.
			saved := letters
			letters = nil
			for _, l := range []byte(t + out) {
				if l != bcast && !slices.Contains(letters, l) {
					letters = append(letters, l)
				}
			}
			visit(0, func() {
				res.Data[offset(out, oshape, val)] += ins[j].Data[offset(t, ins[j].Shape, val)]
			})
			letters = saved
		}
	default:
		n := len(terms)
		if op == "linear" {
			n-- // the bias is added below
		}
		visit(0, func() {
			p := 1.0
			for j := 0; j < n; j++ {
				p *= ins[j].Data[offset(terms[j], ins[j].Shape, val)]
			}
			res.Data[offset(out, oshape, val)] += p
		})
		if op == "linear" {
			saved := letters
			letters = []byte(strings.ReplaceAll(out, string(rune(bcast)), ""))
			b := len(terms) - 1
			visit(0, func() {
				res.Data[offset(out, oshape, val)] += ins[b].Data[offset(terms[b], ins[b].Shape, val)]
			})
			letters = saved
		}
	}
	return res, nil
}

// UnaryF is gelu (tanh approximation) or relu of x.
func UnaryF(op string, x float64) float64 {
	if op == "relu" {
		return max(x, 0)
	}
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

// UnaryGrad is the derivative of gelu (tanh approximation) or relu at x.
func UnaryGrad(op string, x float64) float64 {
	if op == "relu" {
		if x > 0 {
			return 1
		}
		return 0
	}
	c := math.Sqrt(2 / math.Pi)
	u := c * (x + 0.044715*x*x*x)
	t := math.Tanh(u)
	return 0.5*(1+t) + 0.5*x*(1-t*t)*c*(1+3*0.044715*x*x)
}
