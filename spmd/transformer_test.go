package spmd

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/placement"
)

// kinds lists "tensor kind" for each collective.
func kinds(cs []Collective) string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Tensor+" "+c.Step.Kind.String())
	}
	return strings.Join(out, ", ")
}

// TestTransformerRules: the layouts a tensor-parallel transformer uses, and
// the collectives each plans, forward and backward (Megatron's, with and
// without sequence parallelism), and the layouts the rules refuse to use
// as they are (a sharded normalized dim, a sharded sequence, ids'
// gradient).
func TestTransformerRules(t *testing.T) {
	m := placement.MustMesh([]int{4}, []string{"tp"})
	spec := func(s string) placement.Spec {
		sp, err := placement.ParseSpec(s, m)
		if err != nil {
			t.Fatal(err)
		}
		return sp
	}
	for _, tc := range []struct {
		name      string
		op        string
		inputs    []string
		dims      []int
		out       string // the final output layout
		fwd, bwd  string // collectives
		localSpec string // the first input as the local op consumes it
	}{
		// Sequence parallelism: rows split, nothing moves forward; the
		// weight and bias gradients are partial sums over the rows.
		{name: "layer norm, rows split", op: "layernorm", inputs: []string{"8192x768:[S(0)]", "768:[R]", "768:[R]"},
			out: "8192x768:[S(0)]", bwd: "dgamma all_reduce, dbeta all_reduce", localSpec: "8192x768:[S(0)]"},
		// Without sequence parallelism every rank normalizes every row.
		{name: "layer norm, replicated", op: "layernorm", inputs: []string{"16x8:[R]", "8:[R]", "8:[R]"},
			out: "16x8:[R]", localSpec: "16x8:[R]"},
		// The normalized dim is never split: its rows are gathered first.
		{name: "layer norm, normalized dim split", op: "layernorm", inputs: []string{"16x8:[S(1)]", "8:[S(0)]", "8:[S(0)]"}},
		// Heads split: attention is local, forward and backward.
		{name: "attention, heads split", op: "attention", inputs: []string{"2x16x8x4:[S(2)]", "2x16x8x4:[S(2)]", "2x16x8x4:[S(2)]"},
			out: "2x16x8x4:[S(2)]", localSpec: "2x16x8x4:[S(2)]"},
		// A sharded sequence is not attended across ranks: it moves to a
		// split the rule allows.
		{name: "attention, sequence split", op: "attention", inputs: []string{"2x16x8x4:[S(1)]", "2x16x8x4:[S(1)]", "2x16x8x4:[S(1)]"}},
		// Vocabulary-parallel embedding: partial sums, one all-reduce
		// forward; the table's gradient stays in its rows.
		// (GPT-2's vocabulary and width, 8 sequences of 1,024 tokens.)
		{name: "embedding, vocabulary split", op: "embedding", inputs: []string{"8x1024:[R]", "50304x768:[S(0)]"},
			out: "8x1024x768:[R]", fwd: "y all_reduce", bwd: "", localSpec: "8x1024:[R]"},
		{name: "softmax over the split dim", op: "softmax", inputs: []string{"4x16x8:[S(1)]"}, dims: []int{1}},
		{name: "softmax over another dim", op: "softmax", inputs: []string{"4x16x8:[S(1)]"},
			out: "4x16x8:[S(1)]", localSpec: "4x16x8:[S(1)]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := Request{Op: tc.op, Dims: tc.dims}
			if tc.out != "" {
				req.Out = spec(tc.out).Placements // what the next op wants
			}
			names, _ := InputNames(tc.op)
			for j, s := range tc.inputs {
				req.Inputs = append(req.Inputs, Operand{Name: names[j], Spec: spec(s)})
			}
			fwd, err := Forward(req)
			if err != nil {
				t.Fatal(err)
			}
			bwd, err := BackwardOf(fwd, nil, tc.dims)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range fwd.Local {
				if tc.op == "attention" {
					if sh, ok := l.Spec.Placements[0].(placement.Shard); ok && (sh.Dim == 1 || sh.Dim == 3) {
						t.Fatalf("%s consumed as %s: a sequence or head dim split", l.Name, l.Spec)
					}
				}
			}
			if tc.op == "layernorm" || tc.op == "softmax" {
				d := 1
				if tc.op == "softmax" {
					d = 2
					if len(tc.dims) == 1 {
						d = tc.dims[0]
					}
				}
				if sh, ok := fwd.Local[0].Spec.Placements[0].(placement.Shard); ok && sh.Dim == d {
					t.Fatalf("x consumed as %s: the op's dim %d split", fwd.Local[0].Spec, d)
				}
			}
			if tc.localSpec != "" && fwd.Local[0].Spec.String() != tc.localSpec {
				t.Errorf("%s consumed as %s, want %s\n%s", fwd.Local[0].Name, fwd.Local[0].Spec, tc.localSpec, Text(fwd, bwd, 4))
			}
			if tc.out != "" {
				if fwd.Final.Spec.String() != tc.out {
					t.Errorf("output %s, want %s", fwd.Final.Spec, tc.out)
				}
				if got := kinds(fwd.Collectives()); got != tc.fwd {
					t.Errorf("forward collectives %q, want %q\n%s", got, tc.fwd, Text(fwd, bwd, 4))
				}
				if got := kinds(bwd.Collectives()); got != tc.bwd {
					t.Errorf("backward collectives %q, want %q\n%s", got, tc.bwd, Text(fwd, bwd, 4))
				}
			}
		})
	}

	// ids hold integers: no gradient, and asking for one is an error.
	ids, table := Operand{Name: "ids", Spec: spec("4x16:[R]")}, Operand{Name: "table", Spec: spec("64x8:[S(0)]")}
	fwd, err := Forward(Request{Op: "embedding", Inputs: []Operand{ids, table}})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := BackwardOf(fwd, nil, nil); err != nil || len(b.Grads) != 1 || b.Grads[0].Input != "table" {
		t.Fatalf("embedding backward: %v, %v", b, err)
	}
	if _, err := BackwardOf(fwd, []string{"ids"}, nil); !errors.Is(err, ErrGrad) || !strings.Contains(err.Error(), "integer") {
		t.Fatalf("gradient of ids: %v, want ErrGrad", err)
	}
	if _, err := Forward(Request{Op: "embedding", Inputs: []Operand{ids, table}, Options: Options{Grads: []string{"ids"}}}); !errors.Is(err, ErrGrad) {
		t.Fatalf("forward asking for the gradient of ids: %v, want ErrGrad", err)
	}
	if _, err := Forward(Request{Op: "softmax", Inputs: []Operand{{Name: "x", Spec: spec("4x16:[R]")}}, Dims: []int{2}}); !errors.Is(err, ErrShape) {
		t.Fatalf("softmax over dim 2 of a 2-D tensor: %v, want ErrShape", err)
	}
}

// TestCrossEntropyRules: Megatron's vocabulary-parallel cross-entropy from
// the rules, logits [tokens, vocabulary] split by vocabulary over tp = 4:
// amax, sumexp and pick each reduce their shard locally and leave partials
// (maxima, sums, sums) that one all-reduce combines, and each runs right on
// simulated ranks.
func TestCrossEntropyRules(t *testing.T) {
	m := placement.MustMesh([]int{4}, []string{"tp"})
	logits := Operand{Name: "x", Spec: placement.MustSpec([]int{4, 32771}, m, placement.Shard{Dim: 1})}
	rows := placement.MustSpec([]int{4}, m, placement.Replicate{})
	rng := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct {
		op      string
		second  *Operand
		partial placement.ReduceOp
	}{
		{"amax", nil, placement.Max},
		{"sumexp", &Operand{Name: "m", Spec: rows}, placement.Sum},
		{"pick", &Operand{Name: "target", Spec: rows}, placement.Sum},
	} {
		req := Request{Op: tc.op, Inputs: []Operand{logits}, Options: Options{Out: []placement.Placement{placement.Replicate{}}}}
		if tc.op == "amax" {
			req.Dims = []int{1}
		}
		if tc.second != nil {
			req.Inputs = append(req.Inputs, *tc.second)
		}
		fwd, err := Forward(req)
		if err != nil {
			t.Fatal(err)
		}
		if got := kinds(fwd.Collectives()); got != "y all_reduce" || !fwd.Local[0].Spec.Equal(logits.Spec) {
			t.Fatalf("%s: collectives %q, logits consumed as %s: want the shard reduced in place and one all-reduce\n%s", tc.op, got, fwd.Local[0].Spec, Text(fwd, nil, 4))
		}
		if p, ok := fwd.Output.Spec.Placements[0].(placement.Partial); !ok || p.Op != tc.partial {
			t.Fatalf("%s: the local op leaves %s, want P(%s)", tc.op, fwd.Output.Spec, tc.partial)
		}
		var bwd *Backward
		if tc.op != "amax" {
			if bwd, err = BackwardOf(fwd, nil, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := checkNumerically(rng, fwd, bwd); err != nil {
			t.Fatalf("%s: %v\n%s", tc.op, err, Text(fwd, bwd, 4))
		}
	}
	if _, err := Forward(Request{Op: "amax", Inputs: []Operand{logits}, Dims: []int{1}, Options: Options{Grads: []string{"x"}}}); !errors.Is(err, ErrGrad) {
		t.Fatalf("the gradient of amax: %v, want ErrGrad", err)
	}
}
