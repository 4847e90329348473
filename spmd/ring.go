package spmd

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/meshrun/meshrun/placement"
)

// Ring attention (context parallelism). An op whose kind names a sequence
// (kind.seq: the queries' letter, then the keys') may, on a mesh dim named
// in Options.Ring, keep its sequence split instead of moving it whole. Two
// strategies then join the search on that dim:
//
//   - 'C', ring attention: q, k, v and the output all keep the sequence
//     split over the dim (cp); each rank keeps its queries and passes its
//     k and v blocks around the ring of the dim's group, cp−1 steps, each
//     overlapped with the attention of the block it holds; the blocks'
//     outputs merge by log-sum-exp on the rank. Backward passes k, v and
//     the partial dk, dv blocks cp−1 steps, then dk, dv one last step home;
//     dq stays on its rank. Nothing is gathered. The plan lists the
//     transfers in Plan.Ring (and Collectives, CommElems, the reports).
//   - 'G', gather: the queries stay split, k and v are all-gathered and
//     every rank runs the whole attention of its queries; dk and dv come
//     out as partial sums and are reduce-scattered back.
//
// A causal op (kind.causal) splits its sequence in zigzag: of 2·cp chunks,
// rank i holds chunks i and 2·cp−1−i, so every rank does the same work. It
// is a permutation of token positions the runtime applies (at the
// embedding, undone at the loss); for the planner the sequence is still
// sharded over cp. The ring needs 2·cp positions at least.
//
// Only callers that run ring attention ask for it: the transformer layout
// (package linear/layout) and `launcher plan`. Options.Ring empty (the
// zero value) keeps the sequence whole, as every other caller of the
// attention rule (worker verify among them, which runs each op's plan with
// redistribution steps and the reference kernels) expects: a ring is no
// redistribution step, and its transfers must not be handed to code that
// runs placement steps.

// ringKind marks the collectives of a ring (Collective.Ring): no placement
// step has it, so code that runs placement steps refuses them.
const ringKind placement.StepKind = 0xf0

// Ring is ring attention over one mesh dim, as a plan runs it (Plan.Ring).
// Times are the model's: a ring step takes the longer of one block's
// attention and one step's transfers, which overlap.
type Ring struct {
	// MeshDim is the mesh dim the ring runs over (its name: the cp of the
	// layouts), Size its ranks.
	MeshDim, Size int
	// Zigzag: the op is causal and the sequence is split in zigzag chunks.
	Zigzag bool
	// Forward and Backward list what each rank passes to the next: each
	// tensor's block, and on how many ring steps.
	Forward, Backward []RingTransfer
	// StepCompute is one block's attention (the forward's on the busiest
	// rank, divided by Size), StepTransfer one forward step's k and v.
	StepCompute, StepTransfer placement.Picos
	// BackwardStepCompute is one block's gradients; BackwardStepTransfer one
	// backward step's k, v, dk, dv; LastTransfer the last step's dk, dv.
	BackwardStepCompute, BackwardStepTransfer, LastTransfer placement.Picos
	// ForwardTime = (Size−1)·max(StepCompute, StepTransfer) + StepCompute;
	// BackwardTime = (Size−1)·max(BackwardStepCompute, BackwardStepTransfer)
	// + BackwardStepCompute + LastTransfer.
	ForwardTime, BackwardTime placement.Picos
	// ForwardComm and BackwardComm are what the transfers add to the
	// compute, the time priced as communication: ForwardTime − Size·
	// StepCompute, and the same backward.
	ForwardComm, BackwardComm placement.Picos
}

// RingTransfer is one tensor passed around a ring.
type RingTransfer struct {
	Tensor string
	// Spec is the tensor's layout; each rank passes its block, Spec's local
	// shard.
	Spec placement.Spec
	// Steps is the number of ring steps it is passed on.
	Steps int
}

// collectives are the ring's transfers of one phase as Collectives.
func (r *Ring) collectives(ts []RingTransfer) []Collective {
	var out []Collective
	for i := range ts {
		t := ts[i]
		out = append(out, Collective{Tensor: t.Tensor, Ring: &t,
			Step: placement.Step{Kind: ringKind, MeshDims: []int{r.MeshDim}, From: t.Spec, To: t.Spec}})
	}
	return out
}

// Describe is one line on the ring for a person.
func (r *Ring) Describe() string {
	mesh := r.Forward[0].Spec.Mesh
	var b strings.Builder
	fmt.Fprintf(&b, "ring attention over %s (%d ranks)", mesh.DimName(r.MeshDim), r.Size)
	if r.Zigzag {
		fmt.Fprintf(&b, ", sequence in zigzag chunks (rank i holds chunks i and %d−i of %d)", 2*r.Size-1, 2*r.Size)
	}
	fmt.Fprintf(&b, ": forward %s = %d × max(block %s, k+v transfer %s) + %s",
		r.ForwardTime, r.Size-1, r.StepCompute, r.StepTransfer, r.StepCompute)
	if len(r.Backward) > 0 {
		fmt.Fprintf(&b, "; backward %s = %d × max(block %s, k+v+dk+dv transfer %s) + %s + last dk+dv %s",
			r.BackwardTime, r.Size-1, r.BackwardStepCompute, r.BackwardStepTransfer, r.BackwardStepCompute, r.LastTransfer)
	}
	return b.String()
}

// Kind names what the collective does: the step's kind, "send_recv" for a
// ring's transfer.
func (c Collective) Kind() string {
	if c.Ring != nil {
		return "send_recv"
	}
	return c.Step.Kind.String()
}

// Count is the number of calls the collective makes: a ring transfer's
// steps, 1 for a step.
func (c Collective) Count() int {
	if c.Ring != nil {
		return c.Ring.Steps
	}
	return 1
}

// String reads like the step's, "send_recv(S(1)) on cp, 3 steps" for a
// ring's transfer.
func (c Collective) String() string {
	if c.Ring == nil {
		return c.Step.String()
	}
	var ps []string
	for _, d := range c.Step.MeshDims {
		ps = append(ps, c.Ring.Spec.Placements[d].String())
	}
	return fmt.Sprintf("send_recv(%s to the next rank) on %s, %s of %d elements", strings.Join(ps, ","),
		c.Ring.Spec.Mesh.DimName(c.Step.MeshDims[0]), plural(c.Ring.Steps, "step"), c.Ring.Spec.LocalElems(0))
}

// splits reports whether the choice splits letter l's work: a shard of l,
// or the queries of a sequence strategy.
func (c choice) splits(l byte) bool {
	return (c.what == 'S' || c.what == 'C' || c.what == 'G') && c.letter == l
}

// seqLetters are the query and key letters of a sequence op, 0, 0 without.
func (k kind) seqLetters() (byte, byte) {
	if len(k.seq) != 2 {
		return 0, 0
	}
	return k.seq[0], k.seq[1]
}

// ringAllowed reports whether mesh dim i may run ring attention or split
// the queries (Options.Ring, or the forward's choice forced on a gradient).
func (o Options) ringAllowed(mesh placement.Mesh, i int) bool {
	return slices.Contains(o.Ring, mesh.DimName(i)) || i < len(o.force) && o.force[i] != 0
}

// seqChoices adds the sequence strategies to mesh dim i's candidates, or
// narrows them to the one the forward chose.
func seqChoices(e einsum, k kind, mesh placement.Mesh, i int, opts Options, cands []choice) []choice {
	q, t := k.seqLetters()
	if q == 0 || !opts.ringAllowed(mesh, i) || strings.IndexByte(e.out+strings.Join(e.in, ""), q) < 0 {
		return cands
	}
	ring := choice{what: 'C', letter: q, key: t}
	gather := choice{what: 'G', letter: q, key: t}
	if i < len(opts.force) && opts.force[i] != 0 {
		if opts.force[i] == 'C' {
			return []choice{ring}
		}
		return []choice{gather}
	}
	if mesh.Dim(i) < 2 {
		return cands
	}
	out := append(slices.Clone(cands), gather)
	min := mesh.Dim(i)
	if k.causal {
		min *= 2
	}
	if e.size[q] >= min && e.size[t] >= min {
		out = append(out, ring)
	}
	return out
}

// ringTransfer is the modelled time of one ring step sending msgs blocks
// of elems elements in all (one call).
func ringTransfer(m placement.Model, msgs int, elems int64) placement.Picos {
	s := m.Gamma + float64(msgs)*m.Alpha + float64(elems)*float64(m.ElemBytes)/m.Beta
	if s*1e12 >= math.MaxInt64 {
		return math.MaxInt64
	}
	return placement.Picos(math.Round(s * 1e12))
}

// priceRing builds the ring of a forward strategy with a ring choice on
// one mesh dim, and adds its exposed transfers to the strategy's Comm.
// Inputs 1 and 2 are the keys and values.
func (s *strategy) priceRing(k kind, inputs []Operand, opts Options) error {
	dim := -1
	for i, c := range s.choices {
		if c.what == 'C' {
			if dim >= 0 {
				return fmt.Errorf("%w: ring attention over two mesh dims", ErrNoRule)
			}
			dim = i
		}
	}
	if dim < 0 || opts.backward {
		return nil
	}
	mesh := s.out.Mesh
	cp := mesh.Dim(dim)
	r := &Ring{MeshDim: dim, Size: cp, Zigzag: k.causal}
	kv := []RingTransfer{{Tensor: inputs[1].Name, Spec: s.local[1], Steps: cp - 1}, {Tensor: inputs[2].Name, Spec: s.local[2], Steps: cp - 1}}
	r.Forward = kv
	kvElems := placement.SatAdd(s.local[1].MaxLocalElems(), s.local[2].MaxLocalElems())
	r.StepCompute = s.costs.Forward / placement.Picos(cp)
	r.StepTransfer = ringTransfer(s.model, 2, kvElems)
	r.ForwardTime = placement.SatPicos(placement.Picos(cp-1)*max(r.StepCompute, r.StepTransfer), r.StepCompute)
	r.ForwardComm = placement.Picos(cp-1) * max(0, r.StepTransfer-r.StepCompute)
	var grads []RingTransfer
	var gradElems int64
	msgs := 0
	for j := 1; j <= 2; j++ {
		if opts.needsGrad(inputs[j].Name) {
			grads = append(grads, RingTransfer{Tensor: "d" + inputs[j].Name, Spec: s.local[j], Steps: cp})
			gradElems = placement.SatAdd(gradElems, s.local[j].MaxLocalElems())
			msgs++
		}
	}
	if len(grads) > 0 || opts.needsGrad(inputs[0].Name) {
		// Every gradient needs every block of k and v: they go round again.
		r.Backward = append(slices.Clone(kv), grads...)
		r.BackwardStepCompute = s.costs.Backward / placement.Picos(cp)
		r.BackwardStepTransfer = ringTransfer(s.model, 2+msgs, placement.SatAdd(kvElems, gradElems))
		if len(grads) > 0 {
			r.LastTransfer = ringTransfer(s.model, msgs, gradElems)
		}
		r.BackwardTime = placement.SatPicos(placement.SatPicos(placement.Picos(cp-1)*max(r.BackwardStepCompute, r.BackwardStepTransfer),
			r.BackwardStepCompute), r.LastTransfer)
		r.BackwardComm = placement.SatPicos(placement.Picos(cp-1)*max(0, r.BackwardStepTransfer-r.BackwardStepCompute), r.LastTransfer)
	}
	s.ring = r
	s.costs.Comm = placement.SatPicos(placement.SatPicos(s.costs.Comm, r.ForwardComm), r.BackwardComm)
	// Every rank sends its blocks: the forward's, and (as a moved input's
	// gradient is counted) the backward's.
	for i, c := range r.collectives(append(slices.Clone(r.Forward), r.Backward...)) {
		s.cost = placement.SatAdd(s.cost, placement.SatMul(c.Elems(), int64(mesh.Size())))
		if i < len(r.Forward) {
			s.moving += c.Count()
		}
	}
	return nil
}
