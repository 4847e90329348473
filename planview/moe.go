package planview

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
)

// moePlan plans block moe on mesh (spmd.PlanMoE) from the flags.
func (o PlanOptions) moePlan(mesh placement.Mesh) (*spmd.MoEPlan, error) {
	switch {
	case o.Experts < 1:
		return nil, fmt.Errorf("--experts %d: a layer needs at least 1 expert", o.Experts)
	case o.TopK < 1:
		return nil, fmt.Errorf("--top-k %d: each token goes to at least 1 expert", o.TopK)
	case o.TopK > o.Experts:
		return nil, fmt.Errorf("--top-k %d is more than --experts %d", o.TopK, o.Experts)
	}
	es, err := elemSize(o.DType)
	if err != nil {
		return nil, err
	}
	p, err := spmd.PlanMoE(mesh, spmd.MoEShape{T: o.Tokens, H: o.Hidden, F: o.FFN, E: o.Experts, K: o.TopK, Capacity: o.Capacity}, es)
	if err != nil {
		return nil, fmt.Errorf("--mesh %s: %w", mesh, err)
	}
	return p, nil
}

// moeReport is block moe's --json.
type moeReport struct {
	Block       string            `json:"block"`
	Mesh        string            `json:"mesh"`
	Shape       spmd.MoEShape     `json:"shape"`
	Capacity    int               `json:"capacity_per_expert"`
	Tensors     map[string]string `json:"tensors"`
	Collectives []spmd.MoEComm    `json:"collectives"`
}

// runMoE prints block moe's plan: the layouts, then one step's collectives
// with rank 0's bytes under balanced routing and the worst case (every
// token to one rank's experts).
func (o PlanOptions) runMoE(w io.Writer, mesh placement.Mesh) error {
	p, err := o.moePlan(mesh)
	if err != nil {
		return err
	}
	specs := []struct {
		name, what string
		spec       placement.Spec
	}{
		{"x", "tokens [T, H]", p.X}, {"router", "router [E, H]", p.Router},
		{"w1", "experts' first layer [E, F, H]", p.W1}, {"b1", "its bias [E, F]", p.B1},
		{"w2", "experts' second layer [E, H, F]", p.W2}, {"b2", "its bias [E, H] (added by tp rank 0)", p.B2},
	}
	if o.JSON {
		r := moeReport{Block: "moe", Mesh: mesh.String(), Shape: p.Shape, Capacity: p.Shape.MoECapacity(),
			Tensors: map[string]string{}, Collectives: p.Comms}
		for _, s := range specs {
			r.Tensors[s.name] = s.spec.String()
		}
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	s := p.Shape
	fmt.Fprintf(w, "== mixture-of-experts block on %s: tokens %d, hidden %d, ffn %d, experts %d, top-k %d, ", mesh, s.T, s.H, s.F, s.E, s.K)
	if c := s.MoECapacity(); c > 0 {
		fmt.Fprintf(w, "capacity %d slots per expert (factor %g)\n", c, s.Capacity)
	} else {
		fmt.Fprintln(w, "dropless")
	}
	for _, t := range specs {
		fmt.Fprintf(w, "  %-7s %-40s %s\n", t.name, t.what, t.spec)
	}
	first, n := p.Experts(0)
	fmt.Fprintf(w, "rank 0 holds %d of the %d tokens and experts [%d, %d)\n", p.X.LocalShape(0)[0], s.T, first, first+n)
	if len(p.Comms) == 0 {
		fmt.Fprintln(w, "no collectives (one rank)")
		return nil
	}
	fmt.Fprintf(w, "%-9s %-9s %-11s %-11s %-10s %14s %14s\n", "phase", "op", "collective", "tensor", "mesh dims", "bytes", "worst bytes")
	var total, worst [2]int64
	for _, c := range p.Comms {
		dims := make([]string, len(c.MeshDims))
		for i, d := range c.MeshDims {
			dims[i] = mesh.DimName(d)
		}
		where := ""
		if c.Host {
			where = " (host)"
		}
		fmt.Fprintf(w, "%-9s %-9s %-11s %-11s %-10s %14s %14s%s\n", c.Phase, c.Op, c.Kind, c.Tensor, strings.Join(dims, ","),
			layout.FormatBytes(c.Bytes), layout.FormatBytes(c.Worst), where)
		i := 0
		if c.Phase == "backward" {
			i = 1
		}
		total[i] += c.Bytes
		worst[i] += c.Worst
	}
	_, err = fmt.Fprintf(w, "rank 0 sends per step: forward %s (worst %s), backward %s (worst %s); bytes assume balanced routing (T·k/E slots per expert), worst: every token to one rank's experts%s\n",
		layout.FormatBytes(total[0]), layout.FormatBytes(worst[0]), layout.FormatBytes(total[1]), layout.FormatBytes(worst[1]), capNote(s))
	return err
}

func capNote(s spmd.MoEShape) string {
	if s.MoECapacity() > 0 {
		return ", bounded by the capacity"
	}
	return ""
}
