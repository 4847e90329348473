package spmdref

import (
	"fmt"
	"math"
	"slices"
	"strings"

	sim "github.com/meshrun/meshrun/placement/placementref"
)

// LayerNormEps is the epsilon of the layer norm reference (PyTorch's default).
const LayerNormEps = 1e-5

// blockOps are the ops evaluated block by block: every term ends with the
// op's block letters (kept whole within the block), and the letters before
// them index independent blocks. The reference visits every combination of
// the leading letters and calls the op on the blocks of each term; results
// accumulate into the output's block, so a gradient summed over rows (a
// layer norm's gamma) adds up by itself.
var blockOps = map[string]string{
	"layernorm":            "d",
	"layernorm.grad_x":     "d",
	"layernorm.grad_gamma": "d",
	"layernorm.grad_beta":  "d",
	"attention":            "stef",
	"attention.grad_q":     "stef",
	"attention.grad_k":     "stef",
	"attention.grad_v":     "stef",
	"embedding":            "vd",
	"embedding.grad_table": "vd",
	"sumexp":               "v",
	"sumexp.grad_x":        "v",
	"sumexp.grad_m":        "v",
	"pick":                 "v",
	"pick.grad_x":          "v",
}

// IsBlockOp says whether op is one of the block ops (or softmax), whose
// reference is not an einsum.
func IsBlockOp(op string) bool {
	_, ok := blockOps[op]
	return ok || op == "softmax" || op == "softmax_backward"
}

// IsIndex says whether input j of op holds integer indices into the last
// dim of the op's other input (embedding ids, pick's target), which random
// inputs must draw in range.
func IsIndex(op string, j int) bool {
	return op == "embedding" && j == 0 || op == "pick" && j == 1
}

// IndexBound is how many values op's index input may take, given the
// shapes of its inputs: an embedding table's rows, pick's columns.
func IndexBound(op string, shapes [][]int) int {
	if op == "pick" {
		return shapes[0][len(shapes[0])-1]
	}
	return shapes[1][0]
}

// evalBlocks runs a block op; rowOffset is the first vocabulary row of the
// table the local op holds (embedding ops). For every combination of the
// letters outside the op's block letters, each term's block is gathered in
// the order its block letters stand in the term (attention's q[..., s, h,
// e] gives an s×e block per head), the op runs, and the output's block is
// added back where it belongs.
func evalBlocks(op string, terms []string, out string, ins []sim.Tensor, res sim.Tensor, size map[byte]int, rowOffset int) error {
	whole := blockOps[op]
	isWhole := func(l byte) bool { return strings.IndexByte(whole, l) >= 0 }
	var letters []byte
	for _, t := range append(slices.Clone(terms), out) {
		for _, l := range []byte(t) {
			if l != bcast && !isWhole(l) && !slices.Contains(letters, l) {
				letters = append(letters, l)
			}
		}
	}
	// index lists the flat offsets of term t's block for the current values
	// of the other letters, in block order.
	index := func(t string, shape []int, val map[byte]int) []int {
		strides := make([]int, len(t))
		st := 1
		for d := len(t) - 1; d >= 0; d-- {
			strides[d] = st
			st *= shape[d]
		}
		base := 0
		var dims []int
		for d := range t {
			switch {
			case t[d] == bcast:
			case isWhole(t[d]):
				dims = append(dims, d)
			default:
				base += val[t[d]] * strides[d]
			}
		}
		idx := []int{base}
		for _, d := range dims {
			next := make([]int, 0, len(idx)*shape[d])
			for _, b := range idx {
				for i := 0; i < shape[d]; i++ {
					next = append(next, b+i*strides[d])
				}
			}
			idx = next
		}
		return idx
	}
	val := map[byte]int{}
	var err error
	var visit func(i int)
	visit = func(i int) {
		if err != nil {
			return
		}
		if i == len(letters) {
			bs := make([][]float64, len(ins))
			for j, t := range terms {
				for _, k := range index(t, ins[j].Shape, val) {
					bs[j] = append(bs[j], ins[j].Data[k])
				}
			}
			oi := index(out, res.Shape, val)
			ob := make([]float64, len(oi))
			if err = blockOp(op, bs, ob, size, rowOffset); err != nil {
				return
			}
			for n, k := range oi {
				res.Data[k] += ob[n]
			}
			return
		}
		for v := 0; v < size[letters[i]]; v++ {
			val[letters[i]] = v
			visit(i + 1)
		}
	}
	visit(0)
	return err
}

// blockOp computes one block of op into out (accumulating).
func blockOp(op string, in [][]float64, out []float64, size map[byte]int, rowOffset int) error {
	switch op {
	case "layernorm":
		xhat, _ := normalize(in[0])
		for i, v := range xhat {
			out[i] += v*in[1][i] + in[2][i]
		}
	case "layernorm.grad_x":
		dy, x, gamma := in[0], in[1], in[2]
		xhat, inv := normalize(x)
		n := float64(len(x))
		var m1, m2 float64
		for i := range x {
			g := dy[i] * gamma[i]
			m1 += g
			m2 += g * xhat[i]
		}
		m1, m2 = m1/n, m2/n
		for i := range x {
			out[i] += inv * (dy[i]*gamma[i] - m1 - xhat[i]*m2)
		}
	case "layernorm.grad_gamma":
		xhat, _ := normalize(in[1])
		for i, v := range xhat {
			out[i] += in[0][i] * v
		}
	case "layernorm.grad_beta":
		for i, v := range in[0] {
			out[i] += v
		}
	case "attention", "attention.grad_q", "attention.grad_k", "attention.grad_v":
		attention(op, in, out, size['s'], size['t'], size['e'], size['f'])
	case "embedding":
		d := size['d']
		for r := range in[0] {
			if v, ok := row(in[0][r], rowOffset, size['v']); ok {
				for i := 0; i < d; i++ {
					out[r*d+i] += in[1][v*d+i]
				}
			}
		}
	case "sumexp", "sumexp.grad_x", "sumexp.grad_m":
		x, m := in[len(in)-2], in[len(in)-1][0]
		var z float64
		for i, v := range x {
			e := math.Exp(v - m)
			z += e
			if op == "sumexp.grad_x" {
				out[i] += in[0][0] * e
			}
		}
		switch op {
		case "sumexp":
			out[0] += z
		case "sumexp.grad_m":
			out[0] -= in[0][0] * z
		}
	case "pick":
		if r, ok := row(in[1][0], rowOffset, len(in[0])); ok {
			out[0] += in[0][r]
		}
	case "pick.grad_x":
		if r, ok := row(in[1][0], rowOffset, len(out)); ok {
			out[r] += in[0][0]
		}
	case "embedding.grad_table":
		d := size['d']
		for r := range in[1] {
			if v, ok := row(in[1][r], rowOffset, size['v']); ok {
				for i := 0; i < d; i++ {
					out[v*d+i] += in[0][r*d+i]
				}
			}
		}
	default:
		return fmt.Errorf("no reference for %s", op)
	}
	return nil
}

// row is the local table row of id (held as a float), if this rank holds it.
func row(id float64, offset, rows int) (int, bool) {
	v := int(math.Round(id)) - offset
	return v, v >= 0 && v < rows
}

// normalize returns (x - mean) / sqrt(var + eps) and 1 / sqrt(var + eps).
func normalize(x []float64) ([]float64, float64) {
	n := float64(len(x))
	var mean, vr float64
	for _, v := range x {
		mean += v
	}
	mean /= n
	for _, v := range x {
		vr += (v - mean) * (v - mean)
	}
	inv := 1 / math.Sqrt(vr/n+LayerNormEps)
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = (v - mean) * inv
	}
	return out, inv
}

// attention is one (batch, head) block of causal attention or of one of its
// gradients: q[s,e], k[t,e], v[t,f], o[s,f] (gathered from the [..., s, h,
// e] layout); key t attends to query s where t <= s (PyTorch's is_causal,
// aligned at the top left).
func attention(op string, in [][]float64, out []float64, S, T, E, F int) {
	off := 0
	if op != "attention" {
		off = 1 // in[0] is do
	}
	q, k, v := in[off], in[off+1], in[off+2]
	scale := 1 / math.Sqrt(float64(E))
	p := make([]float64, S*T)
	for s := 0; s < S; s++ {
		top := math.Inf(-1)
		for t := 0; t <= min(s, T-1); t++ {
			var dot float64
			for e := 0; e < E; e++ {
				dot += q[s*E+e] * k[t*E+e]
			}
			p[s*T+t] = dot * scale
			top = max(top, p[s*T+t])
		}
		var z float64
		for t := 0; t <= min(s, T-1); t++ {
			p[s*T+t] = math.Exp(p[s*T+t] - top)
			z += p[s*T+t]
		}
		for t := 0; t <= min(s, T-1); t++ {
			p[s*T+t] /= z
		}
	}
	if op == "attention" {
		for s := 0; s < S; s++ {
			for t := 0; t < T; t++ {
				for f := 0; f < F; f++ {
					out[s*F+f] += p[s*T+t] * v[t*F+f]
				}
			}
		}
		return
	}
	do := in[0]
	if op == "attention.grad_v" {
		for s := 0; s < S; s++ {
			for t := 0; t < T; t++ {
				for f := 0; f < F; f++ {
					out[t*F+f] += p[s*T+t] * do[s*F+f]
				}
			}
		}
		return
	}
	// dS = P ⊙ (dP - rowsum(dP ⊙ P)), dP = do·vᵀ.
	ds := make([]float64, S*T)
	for s := 0; s < S; s++ {
		var dot float64
		for t := 0; t < T; t++ {
			var dp float64
			for f := 0; f < F; f++ {
				dp += do[s*F+f] * v[t*F+f]
			}
			ds[s*T+t] = dp
			dot += dp * p[s*T+t]
		}
		for t := 0; t < T; t++ {
			ds[s*T+t] = p[s*T+t] * (ds[s*T+t] - dot)
		}
	}
	for s := 0; s < S; s++ {
		for t := 0; t < T; t++ {
			g := ds[s*T+t] * scale
			for e := 0; e < E; e++ {
				if op == "attention.grad_q" {
					out[s*E+e] += g * k[t*E+e]
				} else {
					out[t*E+e] += g * q[s*E+e]
				}
			}
		}
	}
}

// softmax computes softmax (or its backward: in = dy, x) over the letter 'z'
// of the equation, wherever it stands.
func softmax(op string, term string, ins []sim.Tensor, res sim.Tensor) error {
	d := strings.IndexByte(term, 'z')
	if d < 0 {
		return fmt.Errorf("%s: no softmax dim in %q", op, term)
	}
	shape := res.Shape
	if len(res.Data) == 0 {
		return nil
	}
	stride := 1
	for _, n := range shape[d+1:] {
		stride *= n
	}
	n := shape[d]
	outer := len(res.Data) / (n * stride)
	x := ins[len(ins)-1].Data
	y := make([]float64, n)
	for o := 0; o < outer; o++ {
		for in := 0; in < stride; in++ {
			base := o*n*stride + in
			top := math.Inf(-1)
			for i := 0; i < n; i++ {
				top = max(top, x[base+i*stride])
			}
			var z float64
			for i := 0; i < n; i++ {
				y[i] = math.Exp(x[base+i*stride] - top)
				z += y[i]
			}
			for i := range y {
				y[i] /= z
			}
			if op == "softmax" {
				for i := 0; i < n; i++ {
					res.Data[base+i*stride] = y[i]
				}
				continue
			}
			dy := ins[0].Data
			var dot float64
			for i := 0; i < n; i++ {
				dot += dy[base+i*stride] * y[i]
			}
			for i := 0; i < n; i++ {
				res.Data[base+i*stride] = y[i] * (dy[base+i*stride] - dot)
			}
		}
	}
	return nil
}
