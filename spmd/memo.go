package spmd

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/meshrun/meshrun/placement"
)

// memo remembers the plans solve made, by everything that decides them: the
// op, its equation and rule, the inputs (names, specs, layouts also held),
// the options and the model. A model's layers repeat: a 100-layer model
// plans each distinct layer once. Only plans are kept, never errors (a
// budget error depends on the caller's budget). A hit costs no budget.
var memo = struct {
	sync.Mutex
	plans map[string]*Plan
}{plans: map[string]*Plan{}}

// memoSize bounds the plans remembered; a full memo starts over.
const memoSize = 4096

func memoKey(op string, e einsum, k kind, inputs []Operand, opts Options, m placement.Model) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%v|%s|%v|%s|", op, e, k, inputs[0].Spec.Mesh, m, placement.FormatList(opts.Out))
	for _, in := range inputs {
		fmt.Fprintf(&b, "%s=%s", in.Name, in.Spec)
		for _, a := range in.Also {
			fmt.Fprintf(&b, "+%s", a)
		}
		b.WriteByte(';')
	}
	fmt.Fprintf(&b, "|%s|%t|%q|%d|%t", opts.Output, opts.Grads == nil, opts.Grads, opts.Explain, opts.backward)
	return b.String()
}

// recallPlan returns a copy of the plan remembered under key.
func recallPlan(key string) (*Plan, bool) {
	memo.Lock()
	p, ok := memo.plans[key]
	memo.Unlock()
	if !ok {
		return nil, false
	}
	return p.clone(), true
}

func rememberPlan(key string, p *Plan) {
	memo.Lock()
	defer memo.Unlock()
	if len(memo.plans) >= memoSize {
		clear(memo.plans)
	}
	memo.plans[key] = p.clone()
}

// clone copies p deep enough that a caller may change any of its fields or
// slices; the steps of its moves are shared, and read only.
func (p *Plan) clone() *Plan {
	c := *p
	c.Strategy = slices.Clone(p.Strategy)
	c.Inputs = cloneOperands(p.Inputs)
	c.Local = cloneOperands(p.Local)
	c.Output.Also = slices.Clone(p.Output.Also)
	c.Final.Also = slices.Clone(p.Final.Also)
	c.Moves = slices.Clone(p.Moves)
	if p.Chosen != nil {
		ch := *p.Chosen
		c.Chosen = &ch
	}
	c.RunnersUp = slices.Clone(p.RunnersUp)
	return &c
}

func cloneOperands(ops []Operand) []Operand {
	c := slices.Clone(ops)
	for i := range c {
		c[i].Also = slices.Clone(c[i].Also)
	}
	return c
}
