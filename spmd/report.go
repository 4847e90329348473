package spmd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/meshrun/meshrun/placement"
)

// Report is a forward plan and optionally its backward, in the shape `launcher
// plan --json` prints: bytes count the buffer rank 0 of each group passes into
// each collective, at ElemSize bytes an element.
type Report struct {
	Op        string          `json:"op"`
	Mesh      ReportMesh      `json:"mesh"`
	Inputs    namedTensors    `json:"inputs"`
	Forward   ReportForward   `json:"forward"`
	Backward  *ReportBackward `json:"backward,omitempty"`
	CommBytes ReportBytes     `json:"comm_bytes"`
	// Model priced the plan; Modelled is the forward strategy's cost under it.
	Model    placement.Model `json:"model"`
	Modelled ReportCosts     `json:"modelled"`
	// Backward's gradients, each priced by its own strategy search.
	BackwardModelled *ReportCosts `json:"backward_modelled,omitempty"`
	// Ring is the plan's ring attention, if it runs one.
	Ring *ReportRing `json:"ring,omitempty"`
	// Explain is the chosen forward strategy and its runners-up (Options.Explain).
	Explain *ReportExplain `json:"explain,omitempty"`
}

type ReportExplain struct {
	Chosen    ReportCandidate   `json:"chosen"`
	RunnersUp []ReportCandidate `json:"runners_up"`
}

// ReportCandidate is a Candidate with its cost in bytes and modelled time.
type ReportCandidate struct {
	Strategy    []string    `json:"strategy"`
	Output      []string    `json:"output"`
	SentBytes   int64       `json:"sent_bytes"`
	Collectives int         `json:"collectives"`
	Steps       int         `json:"steps"`
	Work        int64       `json:"work"`
	Modelled    ReportCosts `json:"modelled"`
}

// ReportCosts is Costs in seconds and FLOPs (per rank, the busiest).
type ReportCosts struct {
	TotalS       float64 `json:"total_s"`
	CommS        float64 `json:"comm_s"`
	ForwardS     float64 `json:"forward_compute_s"`
	BackwardS    float64 `json:"backward_compute_s"`
	ForwardFlops int64   `json:"forward_flops_per_rank"`
	BackwardFlop int64   `json:"backward_flops_per_rank"`
	MemoryBytes  int64   `json:"memory_bytes_per_rank"`
}

func reportCosts(c Costs, elemSize int) ReportCosts {
	return ReportCosts{TotalS: c.Time.Seconds(), CommS: c.Comm.Seconds(), ForwardS: c.Forward.Seconds(), BackwardS: c.Backward.Seconds(),
		ForwardFlops: placement.SatMul(2, c.Work), BackwardFlop: placement.SatMul(2, c.BackwardWork), MemoryBytes: placement.SatMul(c.Memory, int64(elemSize))}
}

func reportCandidate(c Candidate, elemSize int) ReportCandidate {
	return ReportCandidate{Strategy: c.Strategy, Output: placementStrings(c.Output), SentBytes: placement.SatMul(c.Cost, int64(elemSize)),
		Collectives: c.Collectives, Steps: c.Steps, Work: c.Work, Modelled: reportCosts(c.Costs, elemSize)}
}

type ReportMesh struct {
	Shape []int    `json:"shape"`
	Names []string `json:"names"`
}

type ReportTensor struct {
	Tensor     string   `json:"tensor,omitempty"`
	Shape      []int    `json:"shape,omitempty"`
	Placements []string `json:"placements"`
	// Scale is a gradient's Grad.Scale, left out when 1.
	Scale float64 `json:"scale,omitempty"`
}

type ReportCollective struct {
	Kind     string `json:"kind"`
	Tensor   string `json:"tensor"`
	MeshDims []int  `json:"mesh_dims"`
	Bytes    int64  `json:"bytes"`
	// Steps is a ring transfer's (kind send_recv) number of ring steps;
	// Bytes counts them all.
	Steps int `json:"steps,omitempty"`
}

// ReportRing is Plan.Ring: ring attention over one mesh dim, its bytes per
// rank (send_recv collectives) and modelled times.
type ReportRing struct {
	MeshDim       string  `json:"mesh_dim"`
	Size          int     `json:"size"`
	Zigzag        bool    `json:"zigzag"`
	ForwardBytes  int64   `json:"forward_bytes_per_rank"`
	BackwardBytes int64   `json:"backward_bytes_per_rank"`
	ForwardS      float64 `json:"forward_s"`
	BackwardS     float64 `json:"backward_s"`
	StepComputeS  float64 `json:"step_compute_s"`
	StepTransferS float64 `json:"step_transfer_s"`
}

type ReportForward struct {
	Output      ReportTensor       `json:"output"`
	Collectives []ReportCollective `json:"collectives"`
}

type ReportBackward struct {
	Grads       namedTensors       `json:"grads"`
	Collectives []ReportCollective `json:"collectives"`
}

type ReportBytes struct {
	Forward  int64 `json:"forward"`
	Backward int64 `json:"backward"`
}

// namedTensors is a JSON object that keeps its keys in order.
type namedTensors []namedTensor

type namedTensor struct {
	Name string
	ReportTensor
}

func (n namedTensors) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, t := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(t.Name)
		v, err := json.Marshal(t.ReportTensor)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func placementStrings(ps []placement.Placement) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

func reportCollectives(cs []Collective, elemSize int) ([]ReportCollective, int64) {
	out := []ReportCollective{}
	var total int64
	for _, c := range cs {
		b := c.Elems() * int64(elemSize)
		total += b
		rc := ReportCollective{Kind: c.Kind(), Tensor: c.Tensor, MeshDims: c.Step.MeshDims, Bytes: b}
		if c.Ring != nil {
			rc.Steps = c.Ring.Steps
		}
		out = append(out, rc)
	}
	return out, total
}

// NewReport summarizes a forward plan and its backward (nil: forward only).
func NewReport(fwd *Plan, bwd *Backward, elemSize int) Report {
	mesh := fwd.Inputs[0].Spec.Mesh
	names := mesh.Names()
	if names == nil {
		names = []string{}
	}
	r := Report{Op: fwd.Op, Mesh: ReportMesh{Shape: mesh.Shape(), Names: names}, Model: fwd.Model, Modelled: reportCosts(fwd.Costs, elemSize)}
	for _, in := range fwd.Inputs {
		r.Inputs = append(r.Inputs, namedTensor{in.Name, ReportTensor{Shape: in.Spec.Shape, Placements: placementStrings(in.Spec.Placements)}})
	}
	r.Forward.Output = ReportTensor{Tensor: fwd.Final.Name, Shape: fwd.Final.Spec.Shape, Placements: placementStrings(fwd.Final.Spec.Placements)}
	r.Forward.Collectives, r.CommBytes.Forward = reportCollectives(fwd.Collectives(), elemSize)
	if bwd != nil {
		rb := &ReportBackward{Grads: namedTensors{}}
		for _, g := range bwd.Grads {
			t := ReportTensor{Placements: placementStrings(g.Final.Spec.Placements)}
			if g.Scale != 1 {
				t.Scale = g.Scale
			}
			rb.Grads = append(rb.Grads, namedTensor{g.Input, t})
		}
		rb.Collectives, r.CommBytes.Backward = reportCollectives(bwd.Collectives(), elemSize)
		r.Backward = rb
		bc := reportCosts(bwd.Costs(), elemSize)
		r.BackwardModelled = &bc
	}
	if rg := fwd.Ring; rg != nil {
		r.Ring = &ReportRing{MeshDim: mesh.DimName(rg.MeshDim), Size: rg.Size, Zigzag: rg.Zigzag, ForwardS: rg.ForwardTime.Seconds(),
			BackwardS: rg.BackwardTime.Seconds(), StepComputeS: rg.StepCompute.Seconds(), StepTransferS: rg.StepTransfer.Seconds()}
		r.Ring.ForwardBytes = placement.SatMul(commElems(rg.collectives(rg.Forward)), int64(elemSize))
		r.Ring.BackwardBytes = placement.SatMul(commElems(rg.collectives(rg.Backward)), int64(elemSize))
	}
	if fwd.Chosen != nil {
		r.Explain = &ReportExplain{Chosen: reportCandidate(*fwd.Chosen, elemSize), RunnersUp: []ReportCandidate{}}
		for _, c := range fwd.RunnersUp {
			r.Explain.RunnersUp = append(r.Explain.RunnersUp, reportCandidate(c, elemSize))
		}
	}
	return r
}

// Text renders a plan for a person: the inputs, the strategy, each collective with
// its bytes, forward then backward.
func Text(fwd *Plan, bwd *Backward, elemSize int) string {
	var b strings.Builder
	mesh := fwd.Inputs[0].Spec.Mesh
	fmt.Fprintf(&b, "%s on mesh %s (%d ranks), %d-byte elements\n", fwd.Op, mesh, mesh.Size(), elemSize)
	fmt.Fprintf(&b, "strategy: %s\n", strings.Join(fwd.Strategy, "; "))
	fmt.Fprintf(&b, "  %-6s %-12s %-20s %-20s %s\n", "tensor", "shape", "given", "local op uses", "rank 0 holds")
	for i, in := range fwd.Inputs {
		l := fwd.Local[i].Spec
		fmt.Fprintf(&b, "  %-6s %-12s %-20s %-20s %s\n", in.Name, placement.FormatShape(in.Spec.Shape),
			placement.FormatList(in.Spec.Placements), placement.FormatList(l.Placements), placement.FormatShape(l.LocalShape(0)))
	}
	f := fwd.Final.Spec
	fmt.Fprintf(&b, "  %-6s %-12s %-20s %-20s %s\n", fwd.Final.Name, placement.FormatShape(f.Shape),
		"-> "+placement.FormatList(f.Placements), placement.FormatList(fwd.Output.Spec.Placements), placement.FormatShape(f.LocalShape(0)))
	if fwd.Ring != nil {
		fmt.Fprintf(&b, "%s\n", fwd.Ring.Describe())
	}
	fb := writeCollectives(&b, "forward", fwd.Collectives(), elemSize)
	var bb int64
	if bwd != nil {
		fmt.Fprintf(&b, "backward: %s arrives as %s\n", bwd.DY.Name, placement.FormatList(bwd.DY.Spec.Placements))
		for _, g := range bwd.Grads {
			fmt.Fprintf(&b, "  %-6s %-12s %-20s %-20s %s\n", g.Output.Name, placement.FormatShape(g.Final.Spec.Shape),
				"-> "+placement.FormatList(g.Final.Spec.Placements), placement.FormatList(g.Output.Spec.Placements), strings.Join(g.Strategy, "; "))
			if g.Scale != 1 {
				fmt.Fprintf(&b, "  %-6s then each rank scales it by %s (P(avg): the gradient of its own term)\n", "", FormatScale(g.Scale))
			}
		}
		bb = writeCollectives(&b, "backward", bwd.Collectives(), elemSize)
	}
	fmt.Fprintf(&b, "comm bytes (rank 0): forward %d, backward %d\n", fb, bb)
	c := fwd.Costs
	fmt.Fprintf(&b, "modelled (%s): forward strategy %s = comm %s (forward moves, gradients' way back) + compute %s forward, %s backward\n",
		fwd.Model.Name, c.Time, c.Comm, c.Forward, c.Backward)
	if bwd != nil {
		bc := bwd.Costs()
		fmt.Fprintf(&b, "modelled backward as planned: %s = comm %s + compute %s\n", bc.Time, bc.Comm, bc.Forward)
	}
	if fwd.Chosen != nil {
		writeExplain(&b, fwd, elemSize)
	}
	return b.String()
}

// writeExplain lists the chosen forward strategy and its runners-up with the
// costs they were ranked by.
func writeExplain(b *strings.Builder, fwd *Plan, elemSize int) {
	b.WriteString("explain: forward strategies, ranked by modelled time (moves, the way back of moved inputs' gradients, compute forward and backward), then collectives, memory\n")
	line := func(label string, c Candidate) {
		fmt.Fprintf(b, "  %-8s %s -> %s\n", label, strings.Join(c.Strategy, "; "), placement.FormatList(c.Output))
		fmt.Fprintf(b, "  %-8s %s = comm %s + compute %s + %s; %d B sent by all ranks, %s and %s forward, %d FLOP/rank forward, %d B/rank held\n", "",
			c.Costs.Time, c.Costs.Comm, c.Costs.Forward, c.Costs.Backward, placement.SatMul(c.Cost, int64(elemSize)),
			plural(c.Collectives, "collective"), plural(c.Steps, "step"), placement.SatMul(2, c.Work), placement.SatMul(c.Costs.Memory, int64(elemSize)))
	}
	line("chosen", *fwd.Chosen)
	for i, c := range fwd.RunnersUp {
		line(fmt.Sprintf("%d.", i+2), c)
	}
	if len(fwd.RunnersUp) == 0 {
		b.WriteString("  (no other strategy reaches the output)\n")
	}
}

func writeCollectives(b *strings.Builder, phase string, cs []Collective, elemSize int) int64 {
	if len(cs) == 0 {
		fmt.Fprintf(b, "%s collectives: none\n", phase)
		return 0
	}
	fmt.Fprintf(b, "%s collectives:\n", phase)
	var total int64
	for i, c := range cs {
		n := c.Elems() * int64(elemSize)
		total += n
		fmt.Fprintf(b, "  %d. %-4s %s, %d B\n", i+1, c.Tensor, c, n)
	}
	return total
}

// FormatScale writes a gradient scale as a fraction where it is one: "1/4",
// "2", else %g.
func FormatScale(f float64) string {
	if f > 0 && f < 1 {
		if n := math.Round(1 / f); math.Abs(1/f-n) < 1e-9 {
			return fmt.Sprintf("1/%d", int64(n))
		}
	}
	if n := math.Round(f); math.Abs(f-n) < 1e-9 {
		return fmt.Sprintf("%d", int64(n))
	}
	return fmt.Sprintf("%g", f)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
