package spmd

import (
	"context"
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/placement"
)

// attentionInputs are q, k, v laid out as sp.
func attentionInputs(sp placement.Spec) []Operand {
	return []Operand{{Name: "q", Spec: sp}, {Name: "k", Spec: sp}, {Name: "v", Spec: sp}}
}

// planAttention plans attention with ring allowed on ring, causal or not
// (the rule is causal; a non-causal op is the same einsum with the kind's
// flag cleared), and its backward.
func planAttention(t *testing.T, sp placement.Spec, causal bool, explain int, ring ...string) (*Plan, *Backward) {
	t.Helper()
	ins := attentionInputs(sp)
	opts := Options{Output: "o", Out: sp.Placements, Ring: ring, Explain: explain}
	var fwd *Plan
	var err error
	if causal {
		fwd, err = Forward(Request{Op: "attention", Inputs: ins, Options: opts})
	} else {
		r := rules["attention"]
		e, eerr := r.einsum("attention", ins, nil)
		if eerr != nil {
			t.Fatal(eerr)
		}
		k := r.kindOf(e, nil)
		k.causal = false
		fwd, err = solve(context.Background(), placement.DefaultPlanner(), "attention", e, k, ins, opts)
	}
	if err != nil {
		t.Fatal(err)
	}
	bwd, err := BackwardOf(fwd, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fwd, bwd
}

// TestRingAttentionBytes: at a long context the planner runs attention as
// a ring over cp = 2, 3, 4, causal (zigzag) or not: nothing is gathered,
// o and every gradient keep the inputs' layout, and each rank sends
// (cp−1)·(|K|+|V|) forward and (cp−1)·(|K|+|V|) + cp·(|dK|+|dV|) backward,
// as send_recv collectives on cp.
func TestRingAttentionBytes(t *testing.T) {
	for _, cp := range []int{2, 3, 4} {
		for _, causal := range []bool{true, false} {
			m := placement.MustMesh([]int{cp}, []string{"cp"})
			sp := placement.MustSpec([]int{2, 12288, 4, 64}, m, placement.Shard{Dim: 1})
			fwd, bwd := planAttention(t, sp, causal, 0, "cp")
			if fwd.Ring == nil {
				t.Fatalf("cp=%d causal %v: no ring: %s", cp, causal, Text(fwd, bwd, 4))
			}
			if fwd.Ring.Zigzag != causal || fwd.Ring.Size != cp || fwd.Ring.MeshDim != 0 || len(fwd.Moves) != 0 {
				t.Errorf("cp=%d causal %v: ring %+v, moves %v", cp, causal, fwd.Ring, fwd.Moves)
			}
			blk := int64(2 * 12288 / cp * 4 * 64) // |K_loc| = |V_loc| = |dK_loc| = |dV_loc|
			if got, want := fwd.CommElems(), int64(cp-1)*2*blk; got != want {
				t.Errorf("cp=%d causal %v: forward sends %d elements, want %d", cp, causal, got, want)
			}
			if got, want := bwd.CommElems(), int64(cp-1)*2*blk+int64(cp)*2*blk; got != want {
				t.Errorf("cp=%d causal %v: backward sends %d elements, want %d", cp, causal, got, want)
			}
			if got := kindsOf(fwd.Collectives()); got != "k send_recv×"+itoa(cp-1)+", v send_recv×"+itoa(cp-1) {
				t.Errorf("cp=%d: forward %s", cp, got)
			}
			if got, want := kindsOf(bwd.Collectives()), strings.Join([]string{"k send_recv×" + itoa(cp-1), "v send_recv×" + itoa(cp-1),
				"dk send_recv×" + itoa(cp), "dv send_recv×" + itoa(cp)}, ", "); got != want {
				t.Errorf("cp=%d: backward %s, want %s", cp, got, want)
			}
			if !fwd.Final.Spec.Equal(sp) || !fwd.Output.Spec.Equal(sp) {
				t.Errorf("cp=%d: o %s", cp, fwd.Final.Spec)
			}
			for _, g := range bwd.Grads {
				if !g.Final.Spec.Equal(sp) || !g.Output.Spec.Equal(sp) || len(g.Moves) != 0 {
					t.Errorf("cp=%d: %s comes out %s, delivered %s, moves %v", cp, g.Input, g.Output.Spec, g.Final.Spec, g.Moves)
				}
				if !strings.Contains(strings.Join(g.Strategy, ";"), "ring attention") {
					t.Errorf("cp=%d: %s's strategy %v", cp, g.Input, g.Strategy)
				}
			}
			text := Text(fwd, bwd, 4)
			if strings.Contains(text, "zigzag") != causal || !strings.Contains(text, "send_recv(S(1) to the next rank) on cp") {
				t.Errorf("cp=%d causal %v:\n%s", cp, causal, text)
			}
		}
	}
}

func itoa(n int) string { return placement.FormatShape([]int{n}) }

// kindsOf lists "tensor kind×count" for each collective.
func kindsOf(cs []Collective) string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Tensor+" "+c.Kind()+"×"+itoa(c.Count()))
	}
	return strings.Join(out, ", ")
}

// TestRingAttentionPrice: the ring is priced as the model says: a step
// takes the longer of one block's compute and one step's transfer (an
// alpha–beta message per block), cp−1 overlapped steps and the last
// block; backward one more transfer of dk and dv; what the transfers add
// beyond the compute is the plan's communication.
func TestRingAttentionPrice(t *testing.T) {
	for _, tc := range []struct {
		cp, seq int
	}{{2, 8192}, {4, 8192}, {2, 64}} {
		m := placement.MustMesh([]int{tc.cp, 2}, []string{"cp", "tp"})
		sp := placement.MustSpec([]int{1, tc.seq, 16, 64}, m, placement.Shard{Dim: 1}, placement.Shard{Dim: 2})
		fwd, bwd := planAttention(t, sp, true, 8, "cp")
		// The plan with the ring the only choice on cp, to read its parts.
		rp, _ := planAttention(t, sp, true, 0, "cp")
		if rp.Ring == nil {
			opts := Options{Output: "o", Out: sp.Placements, force: []byte{'C', 0}}
			r := rules["attention"]
			e, _ := r.einsum("attention", attentionInputs(sp), nil)
			var err error
			if rp, err = solve(context.Background(), placement.DefaultPlanner(), "attention", e, r.kindOf(e, nil), attentionInputs(sp), opts); err != nil {
				t.Fatal(err)
			}
		}
		var ring *Candidate
		for _, c := range append([]Candidate{*fwd.Chosen}, fwd.RunnersUp...) {
			if strings.Join(c.Strategy, ";") == strings.Join(rp.Strategy, ";") {
				ring = &c
			}
		}
		if ring == nil {
			t.Fatalf("cp=%d seq %d: the ring was not priced:\n%s", tc.cp, tc.seq, Text(fwd, bwd, 4))
		}
		rg, mod := rp.Ring, rp.Model
		cp := placement.Picos(tc.cp)
		blk := float64(tc.seq / tc.cp * 8 * 64)
		msg := func(msgs int, elems float64) placement.Picos {
			return placement.Picos(math.Round((mod.Gamma + float64(msgs)*mod.Alpha + elems*4/mod.Beta) * 1e12))
		}
		want := Ring{StepCompute: rp.Costs.Forward / cp, StepTransfer: msg(2, 2*blk),
			BackwardStepCompute: rp.Costs.Backward / cp, BackwardStepTransfer: msg(4, 4*blk), LastTransfer: msg(2, 2*blk)}
		want.ForwardTime = (cp-1)*max(want.StepCompute, want.StepTransfer) + want.StepCompute
		want.BackwardTime = (cp-1)*max(want.BackwardStepCompute, want.BackwardStepTransfer) + want.BackwardStepCompute + want.LastTransfer
		want.ForwardComm = (cp - 1) * max(0, want.StepTransfer-want.StepCompute)
		want.BackwardComm = (cp-1)*max(0, want.BackwardStepTransfer-want.BackwardStepCompute) + want.LastTransfer
		if rg.StepCompute != want.StepCompute || rg.StepTransfer != want.StepTransfer || rg.BackwardStepCompute != want.BackwardStepCompute ||
			rg.BackwardStepTransfer != want.BackwardStepTransfer || rg.LastTransfer != want.LastTransfer || rg.ForwardTime != want.ForwardTime ||
			rg.BackwardTime != want.BackwardTime || rg.ForwardComm != want.ForwardComm || rg.BackwardComm != want.BackwardComm {
			t.Errorf("cp=%d seq %d: ring priced %+v, want %+v", tc.cp, tc.seq, *rg, want)
		}
		if rp.Costs.Comm != rg.ForwardComm+rg.BackwardComm || rp.Costs.Time != rp.Costs.Comm+rp.Costs.Forward+rp.Costs.Backward {
			t.Errorf("cp=%d seq %d: costs %+v, ring %+v", tc.cp, tc.seq, rp.Costs, *rg)
		}
		if ring.Costs.Time != rp.Costs.Time {
			t.Errorf("cp=%d seq %d: the ring candidate costs %s, its plan %s", tc.cp, tc.seq, ring.Costs.Time, rp.Costs.Time)
		}
		// The chosen strategy is the cheapest priced.
		for _, c := range fwd.RunnersUp {
			if c.Costs.Time < fwd.Chosen.Costs.Time {
				t.Errorf("cp=%d seq %d: %v (%s) is cheaper than the chosen %v (%s)", tc.cp, tc.seq, c.Strategy, c.Costs.Time, fwd.Chosen.Strategy, fwd.Chosen.Costs.Time)
			}
		}
	}
}

// TestRingAttentionChoice: hidden 1024, 16 heads on cp=2,tp=2, the planner
// splits the queries and gathers the keys at a context of 64 (a transfer's
// fixed costs outweigh a block's compute), and runs the ring at 8192 where
// the gather's bytes cost more than the overlapped transfers; both are
// priced and reported as chosen. Without Options.Ring the sequence moves
// whole as before, and a sequence shorter than 2·cp (zigzag) has no ring.
func TestRingAttentionChoice(t *testing.T) {
	m := placement.MustMesh([]int{2, 2}, []string{"cp", "tp"})
	spec := func(seq int) placement.Spec {
		return placement.MustSpec([]int{1, seq, 16, 64}, m, placement.Shard{Dim: 1}, placement.Shard{Dim: 2})
	}
	for _, tc := range []struct {
		seq  int
		want string
	}{{64, "gather the keys"}, {8192, "ring attention"}} {
		fwd, bwd := planAttention(t, spec(tc.seq), true, 8, "cp")
		if !strings.Contains(fwd.Strategy[0], tc.want) || (fwd.Ring != nil) != (tc.want == "ring attention") {
			t.Errorf("seq %d: chose %v, want %q:\n%s", tc.seq, fwd.Strategy, tc.want, Text(fwd, bwd, 4))
		}
		if !strings.Contains(fwd.Chosen.Strategy[0], tc.want) {
			t.Errorf("seq %d: explain's chosen %v", tc.seq, fwd.Chosen.Strategy)
		}
		var r struct {
			Ring      *ReportRing
			CommBytes ReportBytes `json:"comm_bytes"`
			Forward   struct{ Collectives []ReportCollective }
		}
		b, _ := json.Marshal(NewReport(fwd, bwd, 4))
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		if (r.Ring != nil) != (fwd.Ring != nil) {
			t.Errorf("seq %d: report's ring %+v", tc.seq, r.Ring)
		}
		if r.Ring != nil {
			blk := int64(tc.seq / 2 * 8 * 64 * 4)
			if r.Ring.ForwardBytes != 2*blk || r.Ring.BackwardBytes != 2*blk+4*blk || r.CommBytes.Forward != 2*blk || r.Forward.Collectives[0].Kind != "send_recv" || !r.Ring.Zigzag {
				t.Errorf("seq %d: report %s", tc.seq, b)
			}
		}
	}
	fwd, _ := planAttention(t, spec(8192), true, 0)
	if fwd.Ring != nil || fwd.Local[0].Spec.Placements[0] == (placement.Shard{Dim: 1}) {
		t.Errorf("without Options.Ring: %v, q used as %s", fwd.Strategy, fwd.Local[0].Spec)
	}
	fwd, bwd := planAttention(t, spec(3), true, 8, "cp")
	if fwd.Ring != nil || strings.Contains(Text(fwd, bwd, 4), "ring attention") {
		t.Errorf("3 positions on cp=2: %v", fwd.Strategy)
	}
}
