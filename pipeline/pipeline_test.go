package pipeline

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

var unit = Cost{F: 1, B: 1, W: 1}

func run(t *testing.T, k Kind, p, m int, c Cost) Timeline {
	t.Helper()
	tl, err := Run(k, p, m, c)
	if err != nil {
		t.Fatalf("%v p=%d m=%d: %v", k, p, m, err)
	}
	return tl
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestCheckEveryKind: every kind's orders pass Check on p in 1..6 and m in
// 1..12 (every kind takes m < p), and Simulate runs them to the end.
func TestCheckEveryKind(t *testing.T) {
	for _, k := range []Kind{GPipe, OneF1B, ZBH1, ZBH2} {
		for p := 1; p <= 6; p++ {
			for m := 1; m <= 12; m++ {
				s, err := Schedule(k, p, m)
				if err != nil {
					t.Fatalf("%v p=%d m=%d: %v", k, p, m, err)
				}
				if err := Check(s, p, m); err != nil {
					t.Errorf("%v p=%d m=%d: %v", k, p, m, err)
				}
				tl := run(t, k, p, m, unit)
				for st := range tl.Stages {
					if len(tl.Stages[st]) != 3*m || !near(tl.Busy[st], float64(3*m)) {
						t.Errorf("%v p=%d m=%d stage %d: %d actions, busy %g", k, p, m, st, len(tl.Stages[st]), tl.Busy[st])
					}
				}
			}
		}
	}
}

// TestLargerPipelines: every kind passes Check up to p=16, m=64, and
// ZB-H1 keeps its bound (step 3m+p−1 at unit costs for m ≥ p, at most p
// micro-batches held).
func TestLargerPipelines(t *testing.T) {
	for _, p := range []int{7, 8, 13, 16} {
		for _, m := range []int{1, p - 1, p, p + 3, 2 * p, 64} {
			for _, k := range []Kind{GPipe, OneF1B, ZBH1, ZBH2} {
				s, err := Schedule(k, p, m)
				if err == nil {
					err = Check(s, p, m)
				}
				if err != nil {
					t.Fatalf("%v p=%d m=%d: %v", k, p, m, err)
				}
			}
			z := run(t, ZBH1, p, m, unit)
			if m >= p && !near(z.Makespan, float64(3*m+p-1)) {
				t.Errorf("zb p=%d m=%d: step %g, want %d", p, m, z.Makespan, 3*m+p-1)
			}
			for s, n := range z.Peak {
				if n > p {
					t.Errorf("zb p=%d m=%d stage %d: peak %d", p, m, s, n)
				}
			}
		}
	}
}

// TestOneF1BBubble: the classic 1F1B bubble. With B and W fused (one
// backward of cost B+W = 2, the gradient sent at its end) and no send time,
// stage s starts its first F at s·F (the activation comes down s stages) and
// its last backward ends (p−1−s)·(B+W) before the step's end (the gradient
// goes up p−1−s stages): every stage waits (p−1)·(F+B+W) and works
// m·(F+B+W), so the step is (m+p−1)·(F+B+W) and the bubble
// (p−1)/(m+p−1). It holds for every m ≥ 1.
func TestOneF1BBubble(t *testing.T) {
	for p := 1; p <= 6; p++ {
		for m := 1; m <= 12; m++ {
			want := float64(p-1) / float64(m+p-1)
			for _, c := range []Cost{unit, {F: 1, B: 2, W: 0}} {
				tl := run(t, OneF1B, p, m, c)
				if !near(tl.Makespan, float64(3*(m+p-1))) || !near(tl.Bubble, want) {
					t.Errorf("p=%d m=%d %+v: step %g, bubble %g; want %d, (p−1)/(m+p−1) = %g", p, m, c, tl.Makespan, tl.Bubble, 3*(m+p-1), want)
				}
				for s := range tl.Idle {
					if !near(tl.Idle[s], float64(3*(p-1))) {
						t.Errorf("p=%d m=%d stage %d: idle %g, want (p−1)(F+B+W) = %d", p, m, s, tl.Idle[s], 3*(p-1))
					}
				}
			}
		}
	}
	tl := run(t, OneF1B, 4, 8, unit)
	if !near(tl.Bubble, 3.0/11) {
		t.Errorf("p=4 m=8: bubble %g, want 3/11", tl.Bubble)
	}
}

// TestZBH1Bubble: ZB-H1 sends the gradient at the end of B and runs W where
// 1F1B waits. At F = B = W = 1 and m ≥ p its step is 3m + p − 1 (a stage
// waits (p−1)·(F+B−W) = p−1: the paper's bound), against 1F1B's 3(m+p−1):
// at p=4, m=8, bubble 3/27 = 0.111 against 9/33 = 0.273, a ratio of 0.41.
// For m < p its step is longer than 3m + p − 1 (the last micro-batch's F and
// B cross the whole pipeline), yet shorter than 1F1B's.
func TestZBH1Bubble(t *testing.T) {
	zb, f1 := run(t, ZBH1, 4, 8, unit), run(t, OneF1B, 4, 8, unit)
	if !near(zb.Makespan, 27) || !near(zb.Bubble, 1.0/9) {
		t.Errorf("zb p=4 m=8: step %g, bubble %g; want 27, 1/9", zb.Makespan, zb.Bubble)
	}
	if zb.Bubble > 0.5*f1.Bubble {
		t.Errorf("zb bubble %g > half of 1f1b's %g", zb.Bubble, f1.Bubble)
	}
	for p := 2; p <= 6; p++ {
		for m := 1; m <= 12; m++ {
			zb, f1 := run(t, ZBH1, p, m, unit), run(t, OneF1B, p, m, unit)
			if m >= p && !near(zb.Makespan, float64(3*m+p-1)) {
				t.Errorf("zb p=%d m=%d: step %g, want 3m+p−1 = %d", p, m, zb.Makespan, 3*m+p-1)
			}
			if zb.Makespan >= f1.Makespan {
				t.Errorf("p=%d m=%d: zb's step %g, 1f1b's %g", p, m, zb.Makespan, f1.Makespan)
			}
		}
	}
}

// TestZBH2: ZB-H2's memory (up to 2p−1 micro-batches on a stage) never
// gives a longer step than ZB-H1, for p in 1..8 and m in 1..16, at unit
// costs (where both reach 3m+p−1 once m ≥ p) and where B costs more than W,
// and holds no more than 2p−1; where B costs more it is shorter: at p=4,
// m=8 and F, B, W = 5.6, 5.4, 4.0 ms (the GPT's, measured) its bubble is
// 0.45 of 1F1B's, ZB-H1's 0.55.
func TestZBH2(t *testing.T) {
	costs := []Cost{unit, {F: 1, B: 1.5, W: 0.5}, {F: 1, B: 1.2, W: 0.8}, {F: 5.6, B: 5.4, W: 4}, {F: 1, B: 1, W: 1, Send: 0.5}}
	for p := 1; p <= 8; p++ {
		for m := 1; m <= 16; m++ {
			for _, c := range costs {
				h1, h2 := run(t, ZBH1, p, m, c), run(t, ZBH2, p, m, c)
				if h2.Makespan > h1.Makespan+1e-9 {
					t.Errorf("p=%d m=%d %+v: zb2's step %g, zb's %g", p, m, c, h2.Makespan, h1.Makespan)
				}
				for s, n := range h2.Peak {
					if n > min(2*p-1, m) {
						t.Errorf("zb2 p=%d m=%d stage %d: peak %d", p, m, s, n)
					}
				}
			}
			if z := run(t, ZBH2, p, m, unit); m >= p && !near(z.Makespan, float64(3*m+p-1)) {
				t.Errorf("zb2 p=%d m=%d: step %g, want %d", p, m, z.Makespan, 3*m+p-1)
			}
		}
	}
	c := Cost{F: 5.6, B: 5.4, W: 4}
	o := run(t, OneF1B, 4, 8, Cost{F: 5.6, B: 9.4})
	h1, h2 := run(t, ZBH1, 4, 8, c), run(t, ZBH2, 4, 8, c)
	if r1, r2 := h1.Bubble/o.Bubble, h2.Bubble/o.Bubble; !(r2 < 0.46 && r1 > 0.54) {
		t.Errorf("bubbles against 1f1b's: zb %.3f, zb2 %.3f; want 0.55, 0.45", r1, r2)
	}
}

// TestPeakActivations: GPipe holds all m micro-batches on every stage;
// 1F1B holds p−s on stage s (its warm-up's p−s−1 and one more), p on stage
// 0; ZB-H1 holds at most p on any stage (later stages hold more than in
// 1F1B, since their Ws wait), so its peak over stages equals 1F1B's.
func TestPeakActivations(t *testing.T) {
	for p := 1; p <= 6; p++ {
		for m := 1; m <= 12; m++ {
			g, o, z := run(t, GPipe, p, m, unit), run(t, OneF1B, p, m, unit), run(t, ZBH1, p, m, unit)
			for s := 0; s < p; s++ {
				if g.Peak[s] != m {
					t.Errorf("gpipe p=%d m=%d stage %d: peak %d, want m", p, m, s, g.Peak[s])
				}
				if want := min(p-s, m); o.Peak[s] != want || o.PeakInput[s] != want {
					t.Errorf("1f1b p=%d m=%d stage %d: peak %d (%d to B), want %d", p, m, s, o.Peak[s], o.PeakInput[s], want)
				}
				if z.Peak[s] > min(p, m) || z.PeakInput[s] > z.Peak[s] {
					t.Errorf("zb p=%d m=%d stage %d: peak %d (%d to B), want at most %d", p, m, s, z.Peak[s], z.PeakInput[s], min(p, m))
				}
			}
			if z.Peak[0] != o.Peak[0] {
				t.Errorf("p=%d m=%d: stage 0 peaks zb %d, 1f1b %d", p, m, z.Peak[0], o.Peak[0])
			}
		}
	}
}

// TestStepTimes: at F = B = W = 1 with no send time GPipe's step equals
// 1F1B's ((m+p−1)·3: both wait (p−1)·3 per stage, GPipe at the switch from
// forwards to backwards, 1F1B at warm-up and cool-down; they differ in
// memory), and ZB-H1's is shorter. With a send time, GPipe pays it 2(p−1)
// times per step (once per hop of its first F and of its first B), 1F1B on
// every round trip of its steady state, so GPipe is faster there; ZB-H1
// still beats both at p=4, m=8.
func TestStepTimes(t *testing.T) {
	g, o, z := run(t, GPipe, 4, 8, unit), run(t, OneF1B, 4, 8, unit), run(t, ZBH1, 4, 8, unit)
	if !(z.Makespan < o.Makespan && near(o.Makespan, g.Makespan)) {
		t.Errorf("steps gpipe %g, 1f1b %g, zb %g: want zb < 1f1b = gpipe", g.Makespan, o.Makespan, z.Makespan)
	}
	c := Cost{F: 1, B: 1, W: 1, Send: 0.5}
	g, o, z = run(t, GPipe, 4, 8, c), run(t, OneF1B, 4, 8, c), run(t, ZBH1, 4, 8, c)
	if !near(g.Makespan, 33+2*3*0.5) {
		t.Errorf("gpipe with send 0.5: step %g, want 33 + 2(p−1)·0.5 = 36", g.Makespan)
	}
	if !(z.Makespan < g.Makespan && g.Makespan < o.Makespan) {
		t.Errorf("steps with send 0.5: gpipe %g, 1f1b %g, zb %g: want zb < gpipe < 1f1b", g.Makespan, o.Makespan, z.Makespan)
	}
}

// TestStageCosts: stages of different sizes (--pp-layers 3,3,1,1): the
// slowest stage sets the steady state's pace.
func TestStageCosts(t *testing.T) {
	c := Cost{Stages: []StageCost{{3, 3, 3}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}}}
	even := run(t, OneF1B, 4, 8, Cost{F: 2, B: 2, W: 2})
	uneven := run(t, OneF1B, 4, 8, c)
	if !(uneven.Makespan > even.Makespan) || uneven.Idle[3] <= uneven.Idle[0] {
		t.Errorf("uneven step %g (idle %v), even %g", uneven.Makespan, uneven.Idle, even.Makespan)
	}
	if _, err := Run(OneF1B, 4, 8, Cost{Stages: c.Stages[:3]}); !errors.Is(err, ErrSchedule) {
		t.Errorf("3 stage costs for 4 stages: %v", err)
	}
	if _, err := Run(OneF1B, 2, 2, Cost{F: 1, B: -1, W: 1}); !errors.Is(err, ErrSchedule) {
		t.Errorf("a negative cost: %v", err)
	}
	if _, err := Run(OneF1B, 2, 2, Cost{F: 1, B: 1, W: math.NaN()}); !errors.Is(err, ErrSchedule) {
		t.Errorf("a NaN cost: %v", err)
	}
}

// TestCheckRefuses: hand-broken orders.
func TestCheckRefuses(t *testing.T) {
	ok := func() [][]Action { s, _ := Schedule(OneF1B, 2, 2); return s }
	for _, tc := range []struct {
		name  string
		sched func() [][]Action
		want  string
	}{
		{"B before its F", func() [][]Action {
			return [][]Action{{{Op: 'F', MB: 0}, {Op: 'F', MB: 1}, {Op: 'B', MB: 0}, {Op: 'W', MB: 0}, {Op: 'B', MB: 1}, {Op: 'W', MB: 1}}, {{Op: 'B', MB: 0}, {Op: 'F', MB: 0}, {Op: 'W', MB: 0}, {Op: 'F', MB: 1}, {Op: 'B', MB: 1}, {Op: 'W', MB: 1}}}
		}, "stage 1, action 0: B0 before F0"},
		{"W before its B", func() [][]Action {
			s := ok()
			s[0][2], s[0][3] = s[0][3], s[0][2]
			return s
		}, "W0 before B0"},
		{"a missing W", func() [][]Action {
			s := ok()
			s[1] = s[1][:len(s[1])-1]
			return s
		}, "stage 1 has no W1"},
		{"a second F", func() [][]Action {
			s := ok()
			s[0] = append(s[0], Action{Op: 'F', MB: 0})
			return s
		}, "a second F0"},
		{"a deadlock", func() [][]Action {
			// Stage 0 waits for B0 before F1; stage 1 runs F1 first.
			return [][]Action{{{Op: 'F', MB: 0}, {Op: 'B', MB: 0}, {Op: 'W', MB: 0}, {Op: 'F', MB: 1}, {Op: 'B', MB: 1}, {Op: 'W', MB: 1}}, {{Op: 'F', MB: 1}, {Op: 'B', MB: 1}, {Op: 'W', MB: 1}, {Op: 'F', MB: 0}, {Op: 'B', MB: 0}, {Op: 'W', MB: 0}}}
		}, "deadlock: stage 0 at B0 (waits for B0 of stage 1); stage 1 at F1 (waits for F1 of stage 0)"},
		{"an unknown op", func() [][]Action {
			s := ok()
			s[0][0].Op = 'X'
			return s
		}, `op 'X'`},
		{"a micro-batch out of range", func() [][]Action {
			s := ok()
			s[0][0].MB = 2
			return s
		}, "micro-batch out of 0..1"},
		{"a stage short", func() [][]Action { return ok()[:1] }, "1 orders for 2 stages"},
	} {
		err := Check(tc.sched(), 2, 2)
		if !errors.Is(err, ErrSchedule) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
		if _, err := Simulate(tc.sched(), unit); err == nil && tc.name != "a stage short" {
			t.Errorf("%s: Simulate ran it", tc.name)
		}
	}
	zb, _ := Schedule(ZBH1, 4, 8)
	if _, err := Simulate(zb, Cost{F: 1, B: 1, W: 1, Fused: true}); err == nil || !strings.Contains(err.Error(), "fused backward") {
		t.Errorf("ZB-H1's order with a fused backward: %v", err)
	}
}

// TestEachAction: every action's own time replays a step: at the costs of
// each kind of action it is the schedule at those costs; one slow action
// on the critical path lengthens the step by its excess; times of the
// wrong count or sign are refused.
func TestEachAction(t *testing.T) {
	sched, err := Schedule(ZBH1, 4, 8)
	if err != nil {
		t.Fatal(err)
	}
	c := Cost{F: 2, B: 3, W: 1.5, Send: 0.25}
	each := make([][]float64, len(sched))
	for s, order := range sched {
		for _, a := range order {
			each[s] = append(each[s], map[byte]float64{'F': c.F, 'B': c.B, 'W': c.W}[a.Op])
		}
	}
	want, err := Simulate(sched, c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Simulate(sched, Cost{Each: each, Send: c.Send})
	if err != nil || got.Makespan != want.Makespan || !slices.Equal(got.Idle, want.Idle) {
		t.Fatalf("replayed: step %g, idle %v (%v); at the costs %g, %v", got.Makespan, got.Idle, err, want.Makespan, want.Idle)
	}
	each[0][0] += 4 // stage 0's first F: everything after it waits
	if slow, _ := Simulate(sched, Cost{Each: each, Send: c.Send}); slow.Makespan != want.Makespan+4 {
		t.Errorf("the first F 4 longer: step %g, want %g", slow.Makespan, want.Makespan+4)
	}
	neg := slices.Clone(each[0])
	neg[2] = -1
	for _, bad := range [][][]float64{each[:3], {each[0][:5], each[1], each[2], each[3]}, {neg, each[1], each[2], each[3]}} {
		if _, err := Simulate(sched, Cost{Each: bad}); !errors.Is(err, ErrSchedule) {
			t.Errorf("times %v: %v", bad, err)
		}
	}
	each[1][3] = math.NaN()
	if _, err := Simulate(sched, Cost{Each: each}); !errors.Is(err, ErrSchedule) {
		t.Errorf("a NaN time: %v", err)
	}
}

// TestRefusals: what Schedule and ParseSchedule refuse.
func TestRefusals(t *testing.T) {
	for _, pm := range [][2]int{{0, 1}, {1, 0}, {-1, 4}} {
		if _, err := Schedule(OneF1B, pm[0], pm[1]); !errors.Is(err, ErrSchedule) {
			t.Errorf("p=%d m=%d: %v", pm[0], pm[1], err)
		}
	}
	for _, s := range []string{"gpipe", "1f1b", "interleaved", "zb", "zb2"} {
		k, err := ParseSchedule(s)
		if err != nil || k.String() != s {
			t.Errorf("%q: %v, %v", s, k, err)
		}
	}
	if _, err := ParseSchedule("bogus"); err == nil || err.Error() != `pipeline: bad schedule: schedule "bogus": want gpipe, 1f1b, interleaved, zb or zb2` {
		t.Errorf("bogus: %v", err)
	}
}

// TestText pins the chart of 1F1B, ZB-H1 and ZB-H2 at p=2, m=3, and of
// the interleaved 1F1B at p=2, m=4, two chunks a stage.
func TestText(t *testing.T) {
	for _, tc := range []struct {
		k    Kind
		want string
	}{
		{OneF1B, `stage 0 |01..BW2BW.BW| idle 3 (25.0%), peak activations 2 (2 to B)
stage 1 |.0BW1BW2BW..| idle 3 (25.0%), peak activations 1 (1 to B)
step 12, bubble 25.0% (idle / (2 stages × step)); one column = 1; F: the micro-batch's last digit, B: input gradient, W: weight gradient, '.': idle
`},
		{ZBH1, `stage 0 |01.BW2BWBW| idle 1 (10.0%), peak activations 2 (2 to B)
stage 1 |.0B1BW2BWW| idle 1 (10.0%), peak activations 2 (1 to B)
step 10, bubble 10.0% (idle / (2 stages × step)); one column = 1; F: the micro-batch's last digit, B: input gradient, W: weight gradient, '.': idle
`},
		{ZBH2, `stage 0 |012BWBWBW.| idle 1 (10.0%), peak activations 3 (3 to B)
stage 1 |.0B1B2BWWW| idle 1 (10.0%), peak activations 3 (1 to B)
step 10, bubble 10.0% (idle / (2 stages × step)); one column = 1; F: the micro-batch's last digit, B: input gradient, W: weight gradient, '.': idle
`},
	} {
		got := run(t, tc.k, 2, 3, unit).Text()
		if got != tc.want {
			t.Errorf("%v:\n%s\nwant\n%s", tc.k, got, tc.want)
		}
	}
	il, err := RunChunks(Interleaved, 2, 4, 2, unit)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := il.Text(), `stage 0 |01ab2.bw3bwcBWdBW.bw.bwBWBW| idle 3 (11.1%), peak activations 5 (5 to B)
stage 1 |.01abwbbw2BW3BWcbwdbwBWBW..| idle 3 (11.1%), peak activations 3 (3 to B)
step 27, bubble 11.1% (idle / (2 stages × step)); one column = 1; F: the micro-batch's last digit, B: input gradient, W: weight gradient, '.': idle; 2 chunks a stage, the odd chunks' in lower case (F as a letter, a for 0)
`; got != want {
		t.Errorf("interleaved:\n%s\nwant\n%s", got, want)
	}
	tl := run(t, OneF1B, 4, 8, unit)
	tl.Unit = 3
	if rows := strings.Split(tl.Text(), "\n"); !strings.HasPrefix(rows[0], "stage 0 |1..BBBBBBBB| idle 9") {
		t.Errorf("one column per 3 units:\n%s", tl.Text())
	}
}

// TestBalance: a split of the blocks into stages costs least at its
// costliest stage (checked against every split, small cases), takes
// layers/pp each with the last layers mod pp one more when the stages are
// alike, and gives the stage with the head (or the embeddings) fewer
// blocks when it costs.
func TestBalance(t *testing.T) {
	stageMax := func(per []int, c SplitCost) float64 {
		m := 0.0
		for s, n := range per {
			v := float64(n) * c.Block
			if s == 0 {
				v += c.First
			}
			if s == len(per)-1 {
				v += c.Last
			}
			m = max(m, v)
		}
		return m
	}
	var best func(layers, pp int, c SplitCost, per []int) float64
	best = func(layers, pp int, c SplitCost, per []int) float64 {
		if len(per) == pp-1 {
			return stageMax(append(per, layers), c)
		}
		b := math.Inf(1)
		for n := 1; n <= layers-(pp-1-len(per)); n++ {
			b = min(b, best(layers-n, pp, c, append(slices.Clone(per), n)))
		}
		return b
	}
	for layers := 1; layers <= 9; layers++ {
		for pp := 1; pp <= min(layers, 4); pp++ {
			for _, c := range []SplitCost{{1, 0, 0}, {1, 0, 2.5}, {2, 3, 0}, {1, 0.4, 1.7}} {
				per := Balance(layers, pp, c)
				sum := 0
				for _, n := range per {
					if n < 1 {
						t.Fatalf("layers %d pp %d cost %+v: %v has an empty stage", layers, pp, c, per)
					}
					sum += n
				}
				if sum != layers || len(per) != pp {
					t.Fatalf("layers %d pp %d cost %+v: %v", layers, pp, c, per)
				}
				if got, want := stageMax(per, c), best(layers, pp, c, nil); math.Abs(got-want) > 1e-9 {
					t.Errorf("layers %d pp %d cost %+v: %v costs %g at its costliest stage, the best split %g", layers, pp, c, per, got, want)
				}
			}
		}
	}
	for _, tc := range []struct {
		layers, pp int
		c          SplitCost
		want       []int
	}{
		{10, 4, SplitCost{}, []int{2, 2, 3, 3}},
		{8, 2, SplitCost{Block: 1}, []int{4, 4}},
		{8, 2, SplitCost{Block: 1, Last: 2}, []int{5, 3}},
		{8, 4, SplitCost{Block: 1, First: 1}, []int{1, 2, 2, 3}},
	} {
		if got := Balance(tc.layers, tc.pp, tc.c); !slices.Equal(got, tc.want) {
			t.Errorf("Balance(%d, %d, %+v) = %v, want %v", tc.layers, tc.pp, tc.c, got, tc.want)
		}
	}
}

// TestInterleaved: Megatron's interleaved 1F1B passes Check for p up to 8,
// v up to 4 chunks a stage and m a multiple of p; every stage runs each
// chunk's F, B and W of every micro-batch, p micro-batches of a chunk
// before the next; at equal costs its bubble is (p−1)/(v·m+p−1), v times
// less than 1F1B's in the limit, and stage s holds at most
// 2(p−s−1)+(v−1)p+1 micro-batches of a chunk; with one chunk it is 1F1B.
func TestInterleaved(t *testing.T) {
	for _, p := range []int{2, 3, 4, 8} {
		for _, v := range []int{2, 3, 4} {
			for _, m := range []int{p, 2 * p, 4 * p} {
				name := fmt.Sprintf("p=%d v=%d m=%d", p, v, m)
				sched, err := ScheduleChunks(Interleaved, p, m, v)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if got := Chunks(sched); got != v {
					t.Fatalf("%s: %d chunks", name, got)
				}
				for s, order := range sched {
					var fs []Action
					for _, a := range order {
						if a.Op == 'F' {
							fs = append(fs, a)
						}
					}
					for k, a := range fs[:p*v] { // the first round: p micro-batches of each chunk in turn
						if a.Chunk != k/p || a.MB != k%p {
							t.Fatalf("%s: stage %d's forward %d is %v", name, s, k, a)
						}
					}
				}
				tl, err := RunChunks(Interleaved, p, m, v, unit)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if want := float64(p-1) / float64(v*m+p-1); !near(tl.Bubble, want) {
					t.Errorf("%s: bubble %.4f, want (p−1)/(v·m+p−1) = %.4f", name, tl.Bubble, want)
				}
				for s, pk := range tl.Peak {
					if most := min(2*(p-s-1)+(v-1)*p+1, m*v); pk > most || len(tl.Stages[s]) != 3*m*v {
						t.Errorf("%s: stage %d: peak %d, want at most %d; %d actions", name, s, pk, most, len(tl.Stages[s]))
					}
				}
			}
		}
	}
	one, err := ScheduleChunks(Interleaved, 4, 8, 1)
	want, _ := Schedule(OneF1B, 4, 8)
	if err != nil || fmt.Sprint(one) != fmt.Sprint(want) {
		t.Errorf("one chunk: %v, %v; 1F1B's %v", one, err, want)
	}
	if a := (Action{Op: 'F', MB: 3, Chunk: 1}); a.String() != "F3c1" {
		t.Errorf("%#v prints %q", a, a.String())
	}
}

// TestInterleavedRefused: chunks for another schedule, interleaving one
// stage, m not a multiple of p; and Check's refusals of chunks.
func TestInterleavedRefused(t *testing.T) {
	for _, tc := range []struct {
		k       Kind
		p, m, v int
		want    string
	}{
		{OneF1B, 2, 4, 2, "1f1b over 2 chunks a stage: only interleaved runs more than one"},
		{Interleaved, 1, 4, 2, "interleaved over 1 stages, 4 micro-batches: want 2 stages or more and micro-batches a multiple of the stages"},
		{Interleaved, 4, 6, 2, "interleaved over 4 stages, 6 micro-batches"},
		{Interleaved, 4, 8, 0, "each must be at least 1"},
	} {
		if _, err := ScheduleChunks(tc.k, tc.p, tc.m, tc.v); !errors.Is(err, ErrSchedule) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v p=%d m=%d v=%d: %v, want %q", tc.k, tc.p, tc.m, tc.v, err, tc.want)
		}
	}
	good, _ := ScheduleChunks(Interleaved, 2, 2, 2)
	for _, tc := range []struct {
		edit func(s [][]Action)
		want string
	}{
		{func(s [][]Action) { s[1][0].Chunk = -1 }, "chunk -1"},
		{func(s [][]Action) { s[0] = s[0][:len(s[0])-2] }, "stage 0 has no"},
		{func(s [][]Action) { // stage 0 runs chunk 1's forward of micro-batch 0 first: stage 1's chunk 0 has not run it
			for i, a := range s[0] {
				if a == (Action{Op: 'F', MB: 0, Chunk: 1}) {
					s[0][0], s[0][i] = s[0][i], s[0][0]
					break
				}
			}
		}, "deadlock: stage 0 at F0c1 (waits for F0 of stage 1)"},
	} {
		s := make([][]Action, len(good))
		for i := range good {
			s[i] = slices.Clone(good[i])
		}
		tc.edit(s)
		if err := Check(s, 2, 2); !errors.Is(err, ErrSchedule) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: want %q", err, tc.want)
		}
	}
}
