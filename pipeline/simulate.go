package pipeline

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// StageCost is the time of one stage's F, B and W of one micro-batch.
type StageCost struct{ F, B, W float64 }

// Cost prices a schedule, in any unit of time (the chart's columns count it).
type Cost struct {
	// F, B and W: every stage's, unless Stages is set (under Interleaved, a
	// chunk's action).
	F, B, W float64
	// Send is the time from the end of an action to its result's arrival on
	// the neighbouring stage: an activation after F(s,i) reaches stage s+1,
	// a gradient after B(s,i) stage s−1. A send occupies neither stage (the
	// links copy while the stages compute).
	Send float64
	// Stages, if not nil, is each stage's own F, B and W (len p), for stages
	// of different sizes; or, with chunks, each virtual stage's (len p·v,
	// virtual stage c·p+s being stage s's chunk c), or each stage's for all
	// its chunks (len p).
	Stages []StageCost
	// Each, if not nil, is every action's own time, stage s's in its order
	// (Each[s][n] for sched[s][n]), in place of F, B, W and Stages: a
	// step as it ran, replayed.
	Each [][]float64
	// Fused runs each B and the W right after it as one backward, whose
	// activation gradient leaves at the W's end: a backward that goes layer
	// by layer computes the stage's input gradient last, after the later
	// layers' weight gradients. GPipe and 1F1B run so (Kind.Fused); ZB-H1
	// sends the gradient at the end of B, which is the point of it.
	// Simulate refuses Fused for an order with a W not right after its B.
	Fused bool
}

// stage is the costs of stage s's chunk ch (Simulate checked Stages' length:
// p or p·v).
func (c Cost) stage(p, s, ch int) StageCost {
	switch {
	case c.Stages == nil:
		return StageCost{c.F, c.B, c.W}
	case len(c.Stages) == p:
		return c.Stages[s]
	}
	return c.Stages[Virtual(p, s, ch)]
}

// Interval is one action's run on its stage.
type Interval struct {
	Op         byte
	MB, Chunk  int
	Start, End float64
}

// Timeline is a schedule as Simulate runs it.
type Timeline struct {
	// P stages of V chunks each (1 but under Interleaved), M micro-batches.
	P, M, V int
	// Stages holds each stage's intervals in its order.
	Stages [][]Interval
	// Makespan is the step's time: from 0, when stage 0 starts, to the end
	// of the last action of any stage.
	Makespan float64
	// Busy and Idle are each stage's time running actions and waiting
	// within the makespan (before its first action and after its last
	// included); Idle = Makespan − Busy.
	Busy, Idle []float64
	// Bubble is the idle fraction of the step: Σ Idle / (P · Makespan).
	Bubble float64
	// Peak is, per stage, the most micro-batches whose activations the
	// stage holds at once (under Interleaved, micro-batches of a chunk,
	// each a chunk's activations): a micro-batch is held from the start of
	// its F to the end of its W (the weight gradient needs the layer inputs the
	// forward saved). PeakInput counts the same to the end of its B instead:
	// what 1F1B's fused backward frees, and the part ZB-H1 keeps longer.
	Peak, PeakInput []int
	// Unit is the time of one column of Text's chart (Simulate sets 1;
	// ≤ 0 reads as 1).
	Unit float64
}

// Simulate runs sched (Check's rules; the micro-batches counted from stage
// 0's order) under cost: each stage runs its actions in its order, each
// starting when the stage's previous action has ended and, for F(s,i), when
// F(s−1,i)'s activation has arrived (its end + Send), for B(s,i), when
// B(s+1,i)'s gradient has (its end + Send; Cost.Fused: its W's end + Send).
// A W needs only its B, which the stage's own order puts before it.
func Simulate(sched [][]Action, cost Cost) (Timeline, error) {
	p := len(sched)
	if p == 0 {
		return Timeline{}, fmt.Errorf("%w: no stages", ErrSchedule)
	}
	v := Chunks(sched)
	m := len(sched[0]) / (3 * v)
	if err := Check(sched, p, m); err != nil {
		return Timeline{}, err
	}
	if cost.Stages != nil && len(cost.Stages) != p && len(cost.Stages) != p*v {
		return Timeline{}, fmt.Errorf("%w: costs of %d stages for %d", ErrSchedule, len(cost.Stages), p*v)
	}
	for u := 0; u < p*v; u++ {
		q, ch := Place(p, u)
		c := cost.stage(p, q, ch)
		for _, x := range []float64{c.F, c.B, c.W, cost.Send} {
			if x < 0 || math.IsNaN(x) || math.IsInf(x, 0) {
				return Timeline{}, fmt.Errorf("%w: stage %d: costs F %g, B %g, W %g, send %g: each must be finite and 0 or more", ErrSchedule, u, c.F, c.B, c.W, cost.Send)
			}
		}
	}
	if cost.Each != nil {
		if len(cost.Each) != p {
			return Timeline{}, fmt.Errorf("%w: the times of %d stages' actions for %d", ErrSchedule, len(cost.Each), p)
		}
		for s, ts := range cost.Each {
			if len(ts) != len(sched[s]) {
				return Timeline{}, fmt.Errorf("%w: stage %d: %d actions' times for %d actions", ErrSchedule, s, len(ts), len(sched[s]))
			}
			for n, x := range ts {
				if x < 0 || math.IsNaN(x) || math.IsInf(x, 0) {
					return Timeline{}, fmt.Errorf("%w: stage %d, action %d: time %g: must be finite and 0 or more", ErrSchedule, s, n, x)
				}
			}
		}
	}
	t := Timeline{P: p, M: m, V: v, Stages: make([][]Interval, p), Busy: make([]float64, p), Idle: make([]float64, p),
		Peak: make([]int, p), PeakInput: make([]int, p), Unit: 1}
	if cost.Fused {
		for s, order := range sched {
			for n, a := range order {
				if a.Op == 'B' && (n+1 == len(order) || order[n+1] != (Action{'W', a.MB, a.Chunk})) {
					return Timeline{}, fmt.Errorf("%w: a fused backward needs each W right after its B: stage %d, action %d: %v", ErrSchedule, s, n, a)
				}
			}
		}
	}
	// end[s][k][c·m+i]: when stage s's F (k 0) or B (k 1) of micro-batch i
	// in chunk c sent its result (F's and B's end; Fused, B's W's end); ok
	// says it has.
	end := make([][2][]float64, p)
	ok := make([][2][]bool, p)
	for s := range end {
		end[s] = [2][]float64{make([]float64, m*v), make([]float64, m*v)}
		ok[s] = [2][]bool{make([]bool, m*v), make([]bool, m*v)}
	}
	free := make([]float64, p) // when each stage's last action ended
	done := func(s, c, k, i int) bool { return ok[s][k][c*m+i] }
	// Check proved the orders run to the end: sweep until they have.
	for left := 3 * p * m * v; left > 0; {
		for s := 0; s < p; s++ {
			for n := len(t.Stages[s]); n < len(sched[s]); n++ {
				a := sched[s][n]
				if !crossReady(a, s, p, v, done) {
					break
				}
				start := free[s]
				u := Virtual(p, s, a.Chunk)
				arrival := func(k, w int) float64 { q, c := Place(p, w); return end[q][k][c*m+a.MB] + cost.Send }
				switch {
				case a.Op == 'F' && u > 0:
					start = max(start, arrival(0, u-1))
				case a.Op == 'B' && u < p*v-1:
					start = max(start, arrival(1, u+1))
				}
				c := cost.stage(p, s, a.Chunk)
				d := map[byte]float64{'F': c.F, 'B': c.B, 'W': c.W}[a.Op]
				if cost.Each != nil {
					d = cost.Each[s][n]
				}
				iv := Interval{Op: a.Op, MB: a.MB, Chunk: a.Chunk, Start: start, End: start + d}
				t.Stages[s] = append(t.Stages[s], iv)
				free[s] = iv.End
				t.Busy[s] += d
				i := a.Chunk*m + a.MB
				switch {
				case a.Op == 'F':
					end[s][0][i], ok[s][0][i] = iv.End, true
				case (a.Op == 'B') != cost.Fused:
					end[s][1][i], ok[s][1][i] = iv.End, true
				}
				left--
			}
		}
	}
	for s := range free {
		t.Makespan = max(t.Makespan, free[s])
	}
	var idle float64
	for s := 0; s < p; s++ {
		t.Idle[s] = t.Makespan - t.Busy[s]
		idle += t.Idle[s]
		t.Peak[s] = peak(t.Stages[s], 'W')
		t.PeakInput[s] = peak(t.Stages[s], 'B')
	}
	if t.Makespan > 0 {
		t.Bubble = idle / (float64(p) * t.Makespan)
	}
	return t, nil
}

// peak is the most micro-batches held at once on a stage: from the start of
// F to the end of the action op.
func peak(ivs []Interval, op byte) int {
	type event struct {
		at    float64
		delta int
	}
	var ev []event
	for _, iv := range ivs {
		switch iv.Op {
		case 'F':
			ev = append(ev, event{iv.Start, +1})
		case op:
			ev = append(ev, event{iv.End, -1})
		}
	}
	// At one instant a release comes before an acquire.
	slices.SortFunc(ev, func(a, b event) int {
		if a.at != b.at {
			if a.at < b.at {
				return -1
			}
			return 1
		}
		return a.delta - b.delta
	})
	n, most := 0, 0
	for _, e := range ev {
		n += e.delta
		most = max(most, n)
	}
	return most
}

// Text draws the timeline: one row per stage, one column per Unit of time,
// each column the action running at its middle (F as its micro-batch's last
// digit, B, W, '.' idle), then the stage's idle time and peak activations,
// and a last line with the step time and the bubble fraction.
func (t Timeline) Text() string {
	u := t.Unit
	if u <= 0 {
		u = 1
	}
	cols := int(math.Ceil(t.Makespan/u - 1e-9))
	var sb strings.Builder
	w := len(fmt.Sprint(t.P - 1))
	for s, ivs := range t.Stages {
		row := make([]byte, cols)
		j := 0
		for c := range row {
			mid := (float64(c) + 0.5) * u
			for j < len(ivs) && ivs[j].End <= mid {
				j++
			}
			row[c] = '.'
			if j < len(ivs) && ivs[j].Start <= mid {
				row[c] = ivs[j].Op
				if row[c] == 'F' {
					row[c] = byte('0' + ivs[j].MB%10)
				}
				if ivs[j].Chunk%2 == 1 { // odd chunks in lower case, F as a letter
					row[c] = map[byte]byte{'B': 'b', 'W': 'w'}[row[c]]
					if row[c] == 0 {
						row[c] = byte('a' + ivs[j].MB%10)
					}
				}
			}
		}
		idle := 0.0
		if t.Makespan > 0 {
			idle = t.Idle[s] / t.Makespan
		}
		fmt.Fprintf(&sb, "stage %*d |%s| idle %s (%.1f%%), peak activations %d (%d to B)\n", w, s, row, num(t.Idle[s]), 100*idle, t.Peak[s], t.PeakInput[s])
	}
	fmt.Fprintf(&sb, "step %s, bubble %.1f%% (idle / (%d stages × step)); one column = %s; F: the micro-batch's last digit, B: input gradient, W: weight gradient, '.': idle",
		num(t.Makespan), 100*t.Bubble, t.P, num(u))
	if t.V > 1 {
		fmt.Fprintf(&sb, "; %d chunks a stage, the odd chunks' in lower case (F as a letter, a for 0)", t.V)
	}
	sb.WriteString("\n")
	return sb.String()
}

// num prints a time with 4 significant digits, without an exponent up to
// 10¹⁵.
func num(v float64) string {
	if v >= 1e4 && v < 1e15 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.4g", v)
}
