package spmd

import (
	"fmt"
	"strings"

	"github.com/meshrun/meshrun/placement"
)

// RedistReport is a redistribution as `launcher plan --op redistribute --json`
// prints it: every step, local ones included. Bytes count the buffer rank 0
// passes into each step (as Report's collectives do); sent_bytes is what all
// ranks send together under the ring algorithms; modelled_s is the step's
// time under the model, what the planner minimizes.
type RedistReport struct {
	Op        string             `json:"op"`
	Mesh      ReportMesh         `json:"mesh"`
	Tensor    string             `json:"tensor"`
	Shape     []int              `json:"shape"`
	From      []string           `json:"from"`
	To        []string           `json:"to"`
	Steps     []ReportRedistStep `json:"steps"`
	CommBytes int64              `json:"comm_bytes"`
	SentBytes int64              `json:"sent_bytes"`
	Model     placement.Model    `json:"model"`
	Modelled  float64            `json:"modelled_s"`

	mesh     placement.Mesh
	steps    []placement.Step
	elemSize int
	time     placement.Picos
}

// ReportRedistStep is one step of a redistribution.
type ReportRedistStep struct {
	Kind     string   `json:"kind"`
	MeshDims []int    `json:"mesh_dims"`
	From     []string `json:"from"`
	To       []string `json:"to"`
	// Moves is false for steps that send nothing (local_slice, owner_partial,
	// or a collective over a mesh dim of size 1).
	Moves     bool    `json:"moves"`
	Bytes     int64   `json:"bytes"`
	SentBytes int64   `json:"sent_bytes"`
	Modelled  float64 `json:"modelled_s"`

	time placement.Picos
}

// NewRedistReport summarizes the steps that take tensor name from its layout
// to the step list's last layout (steps as placement.Plan returns them),
// priced by m at elemSize bytes an element.
func NewRedistReport(name string, from, to placement.Spec, steps []placement.Step, m placement.Model, elemSize int) RedistReport {
	m = m.WithElemBytes(elemSize)
	names := from.Mesh.Names()
	if names == nil {
		names = []string{}
	}
	r := RedistReport{Op: "redistribute", Mesh: ReportMesh{Shape: from.Mesh.Shape(), Names: names}, Tensor: name,
		Shape: from.Shape, From: placementStrings(from.Placements), To: placementStrings(to.Placements), Steps: []ReportRedistStep{},
		mesh: from.Mesh, steps: steps, elemSize: elemSize, Model: m, time: m.PlanTime(steps)}
	r.Modelled = r.time.Seconds()
	es := int64(elemSize)
	for _, st := range steps {
		s := ReportRedistStep{Kind: st.Kind.String(), MeshDims: st.MeshDims, From: placementStrings(st.From.Placements),
			To: placementStrings(st.To.Placements), Moves: st.Moves(), time: m.Time(st)}
		s.Modelled = s.time.Seconds()
		if s.Moves {
			s.Bytes, s.SentBytes = st.InputElems(0)*es, placement.SatMul(st.Cost(), es)
		}
		r.CommBytes += s.Bytes
		r.SentBytes = placement.SatAdd(r.SentBytes, s.SentBytes)
		r.Steps = append(r.Steps, s)
	}
	return r
}

// Text renders the report for a person: the layouts, then one line per step
// with the bytes rank 0 passes in and the bytes all ranks send.
func (r RedistReport) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "redistribute %s %s on mesh %s (%d ranks), %d-byte elements\n", r.Tensor, placement.FormatShape(r.Shape),
		r.mesh, r.mesh.Size(), r.elemSize)
	fmt.Fprintf(&b, "  from [%s] to [%s]\n", strings.Join(r.From, ","), strings.Join(r.To, ","))
	if len(r.steps) == 0 {
		b.WriteString("steps: none (the layouts are the same)\n")
	} else {
		b.WriteString("steps:\n")
		for i, st := range r.steps {
			line := fmt.Sprintf("  %d. %s", i+1, st)
			if s := r.Steps[i]; s.Moves {
				fmt.Fprintf(&b, "%-44s rank 0 passes %d B, all ranks send %d B, modelled %s\n", line, s.Bytes, s.SentBytes, s.time)
			} else {
				fmt.Fprintf(&b, "%-44s no bytes\n", line)
			}
		}
	}
	fmt.Fprintf(&b, "comm bytes (rank 0): %d; sent by all ranks: %d\n", r.CommBytes, r.SentBytes)
	fmt.Fprintf(&b, "modelled (%s): %s\n", r.Model.Name, r.time)
	return b.String()
}
