package spmd

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meshrun/meshrun/placement"
)

// The planner's cache remembers the plans solve made, by everything that
// decides them: the op, its equation and rule, the inputs (names, specs,
// layouts also held), the options and the model. A model's layers repeat: a
// 100-layer model planned with one planner plans each distinct layer once.
// Only plans are kept, never errors (a budget error depends on the caller's
// budget). A hit costs no budget.

// memoKey is the key a plan is remembered under.
func memoKey(op string, e einsum, k kind, inputs []Operand, opts Options, m placement.Model) string {
	var b strings.Builder
	fmt.Fprintf(&b, "spmd|op|%s|%s|%v|%s|%v|%s|", op, e, k, inputs[0].Spec.Mesh, m, placement.FormatList(opts.Out))
	for _, in := range inputs {
		fmt.Fprintf(&b, "%s=%s", in.Name, in.Spec)
		for _, a := range in.Also {
			fmt.Fprintf(&b, "+%s", a)
		}
		b.WriteByte(';')
	}
	fmt.Fprintf(&b, "|%s|%t|%q|%d|%t|%q|%q", opts.Output, opts.Grads == nil, opts.Grads, opts.Explain, opts.backward, opts.Ring, opts.force)
	return b.String()
}

// recallPlan returns a copy of the plan pl remembers under key.
func recallPlan(pl *placement.Planner, key string) (*Plan, bool) {
	v, ok := pl.Recall(key)
	p, _ := v.(*Plan)
	if !ok || p == nil {
		return nil, false
	}
	return p.clone(), true
}

// rememberPlan keeps a copy of p under key, which no caller changes.
func rememberPlan(pl *placement.Planner, key string, p *Plan) {
	pl.Remember(key, p.clone())
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
