package spmd

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meshrun/meshrun/placement"
)

// Operand is a named tensor and its layout.
type Operand struct {
	Name string
	Spec placement.Spec
	// Also lists layouts of the same tensor the caller already holds (an output
	// gradient gathered for an earlier gradient): using one costs nothing.
	Also []placement.Spec
}

func (o Operand) String() string { return o.Name + "=" + o.Spec.String() }

// Move is the redistribution of one tensor, as placement.Plan returns it.
type Move struct {
	Tensor   string
	From, To placement.Spec
	Steps    []placement.Step
}

// Collective is one step that sends bytes between ranks.
type Collective struct {
	Tensor string
	Step   placement.Step
}

// Elems is the number of elements rank 0 passes into the collective.
func (c Collective) Elems() int64 { return c.Step.InputElems(0) }

// Plan is how one op runs on the mesh: the layouts the local op consumes and
// produces, and every redistribution around it.
type Plan struct {
	Op string
	// Equation is the einsum the local op computes, "..." expanded (upper-case
	// letters are batch dims).
	Equation string
	// Strategy says per mesh dim how the work is split.
	Strategy []string
	Inputs   []Operand // as given
	Local    []Operand // as the local op consumes them
	Output   Operand   // as the local op produces it
	Final    Operand   // as the consumer receives it
	// Moves holds the redistributions that do something: inputs in order, then
	// the output.
	Moves []Move
	// Cost is the number of elements all ranks send, in total.
	Cost int64
}

// Collectives lists, in order, every step of the plan that moves bytes.
func (p *Plan) Collectives() []Collective {
	var out []Collective
	for _, m := range p.Moves {
		for _, s := range m.Steps {
			if s.Moves() {
				out = append(out, Collective{Tensor: m.Tensor, Step: s})
			}
		}
	}
	return out
}

// CommElems is the number of elements rank 0 passes into the plan's collectives.
func (p *Plan) CommElems() int64 {
	var n int64
	for _, c := range p.Collectives() {
		n += c.Elems()
	}
	return n
}

// Options steer a plan.
type Options struct {
	// Out is the placement the consumer wants for the output. Nil means the
	// placement the local op produces, with pending partial sums reduced (P -> R).
	Out []placement.Placement
	// Output names the output tensor (default "y").
	Output string
	// Grads names the inputs whose gradients will be computed (nil: all; empty:
	// none). A forward move of such an input is priced twice: its gradient comes
	// back the reverse way.
	Grads    []string
	backward bool
}

func (o Options) needsGrad(name string) bool {
	return !o.backward && (o.Grads == nil || slices.Contains(o.Grads, name))
}

type strategy struct {
	choices []choice
	local   []placement.Spec
	out     placement.Spec
	final   placement.Spec
	moves   []Move
	cost    int64 // elements sent by all ranks, forward moves plus reverse gradient moves
	moving  int   // steps that send bytes
	steps   int   // all steps
	work    int64 // multiply-adds of the local op on the busiest rank
	plans   planCache
}

// planCache remembers redistribution plans within one solve: strategies share
// most of their moves.
type planCache map[string]cachedPlan

type cachedPlan struct {
	steps []placement.Step
	err   error
}

func (c planCache) plan(from, to placement.Spec) ([]placement.Step, error) {
	k := from.String() + ">" + to.String()
	if p, ok := c[k]; ok {
		return p.steps, p.err
	}
	steps, err := placement.Plan(from, to)
	c[k] = cachedPlan{steps, err}
	return steps, err
}

// less orders strategies: fewer elements sent, then fewer collectives, then fewer
// steps, then less local work. Equal strategies keep enumeration order.
func (s *strategy) less(o *strategy) bool {
	switch {
	case s.cost != o.cost:
		return s.cost < o.cost
	case s.moving != o.moving:
		return s.moving < o.moving
	case s.steps != o.steps:
		return s.steps < o.steps
	}
	return s.work < o.work
}

// solve enumerates every strategy of an einsum and returns the cheapest plan.
func solve(op string, e einsum, k kind, inputs []Operand, opts Options) (*Plan, error) {
	mesh := inputs[0].Spec.Mesh
	given := make([]placement.Spec, len(inputs))
	for i, in := range inputs {
		given[i] = in.Spec
	}
	if opts.Out != nil && len(opts.Out) != mesh.NDim() {
		return nil, fmt.Errorf("%w: %s: %d output placements for the %d-D mesh %s", ErrNoRule, describe(op, inputs), len(opts.Out), mesh.NDim(), mesh)
	}
	cands := make([][]choice, mesh.NDim())
	for i := range cands {
		cands[i] = candidates(e, k, given, i)
	}
	var best *strategy
	var firstErr error
	cache := planCache{}
	idx := make([]int, mesh.NDim())
	for {
		cs := make([]choice, mesh.NDim())
		for i := range cs {
			cs[i] = cands[i][idx[i]]
		}
		s, err := price(e, k, given, inputs, cs, opts, cache)
		if err == nil && (best == nil || s.less(best)) {
			best = s
		} else if err != nil && firstErr == nil {
			firstErr = err
		}
		// Next combination, last mesh dim fastest.
		i := len(idx) - 1
		for ; i >= 0; i-- {
			idx[i]++
			if idx[i] < len(cands[i]) {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			break
		}
	}
	if best == nil {
		return nil, fmt.Errorf("%w: %s: no strategy reaches the output: %v", ErrNoRule, describe(op, inputs), firstErr)
	}
	outName := opts.Output
	if outName == "" {
		outName = "y"
	}
	p := &Plan{Op: op, Equation: e.String(), Inputs: inputs, Moves: best.moves, Cost: best.cost,
		Output: Operand{Name: outName, Spec: best.out}, Final: Operand{Name: outName, Spec: best.final}}
	for i, c := range best.choices {
		p.Strategy = append(p.Strategy, mesh.DimName(i)+": "+c.label(e))
	}
	for i, in := range inputs {
		p.Local = append(p.Local, Operand{Name: in.Name, Spec: best.local[i]})
	}
	for i := range p.Moves {
		if p.Moves[i].Tensor == "" {
			p.Moves[i].Tensor = outName
		}
	}
	return p, nil
}

// price builds one strategy's layouts and prices its redistributions.
func price(e einsum, k kind, given []placement.Spec, inputs []Operand, cs []choice, opts Options, cache planCache) (*strategy, error) {
	mesh := given[0].Mesh
	nIn := len(e.in)
	if k.bias {
		nIn--
	}
	s := &strategy{choices: cs, plans: cache}
	outPl := make([]placement.Placement, len(cs))
	for i, c := range cs {
		outPl[i] = place(e, given, i, c, e.out, true, -1)
	}
	out, err := placement.NewSpec(e.shapeOf(e.out), mesh, outPl...)
	if err != nil {
		return nil, err
	}
	s.out = out
	for j := range e.in {
		pl := make([]placement.Placement, len(cs))
		for i, c := range cs {
			if j < nIn {
				pl[i] = place(e, given, i, c, e.in[j], false, j)
			} else {
				pl[i] = biasPlacement(e.out, e.in[j], outPl[i])
			}
		}
		local, err := placement.NewSpec(given[j].Shape, mesh, pl...)
		if err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(inputs[j].Also, local.Equal) {
			if err := s.move(inputs[j].Name, given[j], local); err != nil {
				return nil, err
			}
		}
		if opts.needsGrad(inputs[j].Name) {
			if err := s.reverse(given[j], local); err != nil {
				return nil, err
			}
		}
		s.local = append(s.local, local)
	}
	s.work = work(e, s.local, out)
	final := out.Placements
	if opts.Out != nil {
		final = opts.Out
	} else {
		final = append([]placement.Placement(nil), final...)
		for i, p := range final {
			if _, ok := p.(placement.Partial); ok {
				final[i] = placement.Replicate{}
			}
		}
	}
	fs, err := placement.NewSpec(out.Shape, mesh, final...)
	if err != nil {
		return nil, err
	}
	s.final = fs
	return s, s.move("", out, fs)
}

func (s *strategy) move(name string, from, to placement.Spec) error {
	steps, err := s.plans.plan(from, to)
	if err != nil {
		return err
	}
	s.cost += placement.PlanCost(steps)
	s.steps += len(steps)
	for _, st := range steps {
		if st.Moves() {
			s.moving++
		}
	}
	if len(steps) > 0 {
		s.moves = append(s.moves, Move{Tensor: name, From: from, To: to, Steps: steps})
	}
	return nil
}

// reverse prices the gradient's way back when an input moved from given to
// local: the gradient of a replicated use arrives as partial sums, of a partial
// use replicated, of a shard as the shard, and must reach the dual of given.
func (s *strategy) reverse(given, local placement.Spec) error {
	if given.Equal(local) {
		return nil
	}
	target, err := dual("", Operand{Spec: given})
	if err != nil {
		return nil // no gradient layout: nothing to price
	}
	nat := slices.Clone(local.Placements)
	for i, p := range nat {
		switch p.(type) {
		case placement.Replicate:
			nat[i] = placement.Partial{Op: placement.Sum}
		case placement.Partial:
			nat[i] = placement.Replicate{}
		}
	}
	from, err := placement.NewSpec(local.Shape, local.Mesh, nat...)
	if err != nil {
		return nil
	}
	steps, err := s.plans.plan(from, target)
	if err != nil {
		return err
	}
	s.cost += placement.PlanCost(steps)
	return nil
}

// work is the number of multiply-adds of the local op on the busiest rank: the
// product of the local sizes of every letter.
func work(e einsum, local []placement.Spec, out placement.Spec) int64 {
	var most int64
	for r := 0; r < out.Mesh.Size(); r++ {
		size := map[byte]int{}
		terms := append(slices.Clone(e.in), e.out)
		specs := append(slices.Clone(local), out)
		for j, t := range terms {
			shape := specs[j].LocalShape(r)
			for d := range t {
				if t[d] != bcast {
					size[t[d]] = shape[d]
				}
			}
		}
		w := int64(1)
		for _, n := range size {
			w *= int64(n)
		}
		most = max(most, w)
	}
	return most
}

func describe(op string, inputs []Operand) string {
	parts := make([]string, len(inputs))
	for i, in := range inputs {
		parts[i] = in.String()
	}
	return op + " " + strings.Join(parts, " ")
}
