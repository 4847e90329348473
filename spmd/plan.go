package spmd

import (
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
	// Ring, when set, is a transfer of ring attention (Plan.Ring), no
	// redistribution step: Step then names only the mesh dim and the
	// tensor's layout, and its Kind is one no placement step has (Kind()
	// says "send_recv").
	Ring *RingTransfer
}

// Elems is the number of elements rank 0 passes into the collective: a ring
// transfer's block times its steps.
func (c Collective) Elems() int64 {
	if c.Ring != nil {
		return placement.SatMul(int64(c.Ring.Steps), c.Ring.Spec.LocalElems(0))
	}
	return c.Step.InputElems(0)
}

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
	// Model priced the plan; Costs are its modelled times.
	Model placement.Model
	Costs Costs
	// Ring is ring attention over a mesh dim (context parallel), nil for
	// every other strategy: its transfers are listed by Collectives (the
	// forward's) and by the Backward planned from this plan. They are not
	// Moves: no redistribution runs them.
	Ring *Ring
	// seq: per mesh dim, the sequence strategy chosen ('C', 'G'; nil: none),
	// which the gradients take too.
	seq []byte
	// Chosen and RunnersUp are the chosen strategy and the next cheapest ones,
	// in order, with their modelled costs: filled when Options.Explain asks.
	Chosen    *Candidate
	RunnersUp []Candidate
}

// RowOffset is the first vocabulary row (an embedding's table) or column
// (pick's logits) the local op of rank holds: the lookups and their
// gradients read or add into only their shard's. 0 for every other op.
func (p *Plan) RowOffset(rank int) int {
	var s placement.Spec
	dim := 0
	switch p.Op {
	case "embedding":
		s = p.Local[1].Spec
	case "embedding.grad_table":
		s = p.Output.Spec
	case "pick": // the vocabulary is x's last dim
		s = p.Local[0].Spec
		dim = len(s.Shape) - 1
	case "pick.grad_x":
		s = p.Output.Spec
		dim = len(s.Shape) - 1
	default:
		return 0
	}
	_, off := s.Local(rank)
	return off[dim]
}

// Costs is what a strategy costs under the plan's Model. Strategies are
// ranked by Time, then fewer collectives, then less Memory.
type Costs struct {
	// Time = Comm + Forward + Backward.
	Time placement.Picos
	// Comm is the modelled time of the forward moves and of the way back of
	// the gradients of inputs that moved.
	Comm placement.Picos
	// Forward is the local op's arithmetic on the busiest rank; Backward that
	// of the gradients it will need (one op of the same size per input whose
	// gradient is wanted, the bias's a reduction left out).
	Forward, Backward placement.Picos
	// Work is the local op's multiply-adds on the busiest rank; BackwardWork
	// the gradients'.
	Work, BackwardWork int64
	// Memory is the elements the busiest rank holds of the local op's inputs
	// and output.
	Memory int64
}

// Candidate is one strategy the engine priced: per mesh dim how the work is
// split, and the modelled cost it was ranked by.
type Candidate struct {
	Strategy []string
	// Output is the placements the local op produces.
	Output []placement.Placement
	// Cost is the elements all ranks send (forward moves, and the way back of
	// the gradients of inputs that moved); Collectives and Steps count the
	// forward's; Work is the local op's multiply-adds on the busiest rank.
	Cost        int64
	Collectives int
	Steps       int
	Work        int64
	Costs       Costs
}

// Collectives lists, in order, every step of the plan that moves bytes.
func (p *Plan) Collectives() []Collective {
	var out []Collective
	if p.Ring != nil {
		out = p.Ring.collectives(p.Ring.Forward)
	}
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
func (p *Plan) CommElems() int64 { return commElems(p.Collectives()) }

// commElems is the number of elements rank 0 passes into collectives cs.
func commElems(cs []Collective) int64 {
	var n int64
	for _, c := range cs {
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
	Grads []string
	// Explain keeps this many runners-up to the chosen strategy in the plan
	// (Plan.RunnersUp), for a person to compare; 0 keeps none.
	Explain int
	// Ring names the mesh dims over which an op with a sequence (attention)
	// may keep it split: run ring attention, or split the queries and
	// gather the keys and values, whichever the model prices cheaper (see
	// ring.go). Empty (the default) moves a split sequence whole first.
	// Only callers whose runtime runs ring attention set it.
	Ring []string
	// force: per mesh dim, the sequence strategy a gradient must take (the
	// forward's), 0 for none.
	force    []byte
	backward bool
	// stats, if set, receives the search's counts.
	stats *SearchStats
}

// SearchStats counts what one strategy search did.
type SearchStats struct {
	Strategies int // every combination of choices
	Priced     int // strategies priced (their moves planned)
	Bounded    int // partial strategies bounded
}

func (o Options) needsGrad(name string) bool {
	return !o.backward && (o.Grads == nil || slices.Contains(o.Grads, name))
}

func describe(op string, inputs []Operand) string {
	parts := make([]string, len(inputs))
	for i, in := range inputs {
		parts[i] = in.String()
	}
	return op + " " + strings.Join(parts, " ")
}
