// Package pipeline decides the order of work of pipeline parallelism and
// models it: a model's blocks split into p stages over a mesh dim pp, a step's
// batch into m micro-batches. Per stage s and micro-batch i there are three
// actions:
//
//   - F: the forward; its activation goes to stage s+1.
//   - B: the backward for the input, the activation gradient sent at once to
//     stage s−1.
//   - W: the backward for the weights (dW, db), which nothing downstream waits
//     for.
//
// F(s,i) needs F(s−1,i); B(s,i) needs F(s,i) and B(s+1,i) (the last stage's B
// needs only its F: the loss); W(s,i) needs B(s,i).
//
// Schedule gives each stage's order for GPipe, 1F1B and ZB-H1; Check holds an
// order to those rules and proves it free of deadlock; Simulate times it
// under a Cost and Timeline.Text draws it. The package is pure: orders in,
// timelines out, no I/O, no clock and no goroutines. docs/pipeline.md has the
// schedules, the model and the chart.
package pipeline

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Kind is a pipeline schedule.
type Kind int

const (
	// GPipe runs every micro-batch's F, then every B, each followed by its W:
	// a stage holds the activations of all m micro-batches at once.
	GPipe Kind = iota
	// OneF1B (PipeDream-flush, Megatron's default) runs p−s−1 forwards of
	// warm-up on stage s, then alternates one F and one B (its W right after
	// it), then the cool-down's Bs: a stage holds at most p−s micro-batches.
	OneF1B
	// ZBH1 is the H1 schedule of "Zero Bubble Pipeline Parallelism" (Qi et
	// al.): 1F1B's memory (at most p−s micro-batches on stage s), with W split
	// from B and deferred into the slots where the stage would wait.
	ZBH1
	// ZBH2 is a zero-bubble schedule with ZB-H2's memory (the same paper): W
	// split from B and deferred as in ZB-H1, and up to 2p−1 micro-batches in
	// flight on every stage, so that extra forwards fill the wait for the
	// first gradient and the Ws fill the cool-down.
	ZBH2
	// Interleaved is Megatron-LM's interleaved 1F1B: each stage holds v
	// chunks of the model (virtual stages), stage s the chunks s, s+p, …,
	// s+(v−1)p of p·v, so a micro-batch goes round the stages v times; the
	// stages run 1F1B over their chunks, p micro-batches of a chunk before
	// the next chunk's, with a longer warm-up. The bubble shrinks v times
	// ((p−1)/(v·m+p−1) at equal costs) for v times the sends, and m must
	// be a multiple of p. B and W run fused, as in 1F1B.
	Interleaved
)

// Names lists the schedules ParseSchedule reads, for messages.
const Names = "gpipe, 1f1b, interleaved, zb or zb2"

// ErrSchedule is wrapped by every refusal of this package: a schedule that
// cannot be built, an order Check refuses, a Cost that does not fit.
var ErrSchedule = errors.New("pipeline: bad schedule")

// ParseSchedule reads a schedule's name: gpipe, 1f1b, interleaved
// (Megatron's interleaved 1F1B), zb (ZB-H1) or zb2 (ZB-H2's memory).
func ParseSchedule(s string) (Kind, error) {
	switch strings.ToLower(s) {
	case "gpipe":
		return GPipe, nil
	case "1f1b":
		return OneF1B, nil
	case "zb", "zb-h1", "zbh1":
		return ZBH1, nil
	case "zb2", "zb-h2", "zbh2":
		return ZBH2, nil
	case "interleaved", "1f1b-interleaved", "interleaved-1f1b":
		return Interleaved, nil
	}
	return 0, fmt.Errorf("%w: schedule %q: want %s", ErrSchedule, s, Names)
}

// String is the name ParseSchedule reads.
func (k Kind) String() string {
	switch k {
	case GPipe:
		return "gpipe"
	case OneF1B:
		return "1f1b"
	case ZBH1:
		return "zb"
	case ZBH2:
		return "zb2"
	case Interleaved:
		return "interleaved"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Fused says whether the kind runs each B and its W as one backward (see
// Cost.Fused): GPipe and 1F1B do, the zero-bubble kinds do not.
func (k Kind) Fused() bool { return k != ZBH1 && k != ZBH2 }

// Run is Schedule and Simulate: the kind's orders timed under cost, with
// cost.Fused set by the kind.
func Run(kind Kind, p, m int, cost Cost) (Timeline, error) {
	return RunChunks(kind, p, m, 1, cost)
}

// RunChunks is Run with v chunks per stage (ScheduleChunks); cost prices
// one chunk's actions.
func RunChunks(kind Kind, p, m, v int, cost Cost) (Timeline, error) {
	sched, err := ScheduleChunks(kind, p, m, v)
	if err != nil {
		return Timeline{}, err
	}
	cost.Fused = kind.Fused()
	return Simulate(sched, cost)
}

// Virtual is the virtual stage of stage s's chunk c, of p stages: c·p+s,
// the interleaved schedule's placement (with one chunk, the stage itself).
func Virtual(p, s, c int) int { return c*p + s }

// Place is the stage and the chunk of virtual stage u, of p stages
// (Virtual's inverse).
func Place(p, u int) (s, c int) { return u % p, u / p }

// Action is one piece of a stage's work: Op 'F', 'B' or 'W' on micro-batch
// MB, in the stage's chunk Chunk (0 but under Interleaved: virtual stage
// Chunk·p + s of stage s).
type Action struct {
	Op    byte
	MB    int
	Chunk int
}

// String is the op and the micro-batch ("F3"), and the chunk after a "c"
// when not 0 ("F3c1").
func (a Action) String() string {
	if a.Chunk != 0 {
		return fmt.Sprintf("%c%dc%d", a.Op, a.MB, a.Chunk)
	}
	return fmt.Sprintf("%c%d", a.Op, a.MB)
}

// Schedule returns each stage's order of actions (stage 0 first) for p stages
// and m micro-batches. Every kind takes any p ≥ 1 and m ≥ 1: with m < p,
// 1F1B's and ZB-H1's warm-up is cut to the m micro-batches there are and
// their steady state is empty, which is legal but leaves most of the step
// idle (a bubble above a half); Check passes either way.
//
// Each stage's B and W are separate actions in every kind; GPipe and 1F1B
// place every W right after its B, so they run as one backward whose
// activation gradient leaves at the end of its B part.
func Schedule(kind Kind, p, m int) ([][]Action, error) {
	return ScheduleChunks(kind, p, m, 1)
}

// ScheduleChunks is Schedule with v chunks per stage: v ≥ 2 only under
// Interleaved, which takes p ≥ 2 and m a multiple of p (with v = 1 it is
// 1F1B).
func ScheduleChunks(kind Kind, p, m, v int) ([][]Action, error) {
	if p < 1 || m < 1 || v < 1 {
		return nil, fmt.Errorf("%w: %d stages, %d micro-batches and %d chunks a stage: each must be at least 1", ErrSchedule, p, m, v)
	}
	if v > 1 && kind != Interleaved {
		return nil, fmt.Errorf("%w: %v over %d chunks a stage: only interleaved runs more than one", ErrSchedule, kind, v)
	}
	switch kind {
	case GPipe:
		return gpipe(p, m), nil
	case OneF1B:
		return oneF1B(p, m), nil
	case ZBH1:
		return zbH1(p, m), nil
	case ZBH2:
		return zbH2(p, m), nil
	case Interleaved:
		if v == 1 {
			return oneF1B(p, m), nil
		}
		if p < 2 || m%p != 0 {
			return nil, fmt.Errorf("%w: interleaved over %d stages, %d micro-batches: want 2 stages or more and micro-batches a multiple of the stages", ErrSchedule, p, m)
		}
		return interleaved(p, m, v), nil
	}
	return nil, fmt.Errorf("%w: unknown schedule %v", ErrSchedule, kind)
}

func gpipe(p, m int) [][]Action {
	out := make([][]Action, p)
	for s := range out {
		for i := 0; i < m; i++ {
			out[s] = append(out[s], Action{Op: 'F', MB: i})
		}
		for i := 0; i < m; i++ {
			out[s] = append(out[s], Action{Op: 'B', MB: i}, Action{Op: 'W', MB: i})
		}
	}
	return out
}

func oneF1B(p, m int) [][]Action {
	out := make([][]Action, p)
	for s := range out {
		warm := min(p-s-1, m)
		for i := 0; i < warm; i++ {
			out[s] = append(out[s], Action{Op: 'F', MB: i})
		}
		for i := 0; i < m; i++ {
			if f := warm + i; f < m {
				out[s] = append(out[s], Action{Op: 'F', MB: f})
			}
			out[s] = append(out[s], Action{Op: 'B', MB: i}, Action{Op: 'W', MB: i})
		}
	}
	return out
}

// interleaved is Megatron-LM's interleaved 1F1B: stage s's k-th forward
// (of m·v) is of chunk (k mod p·v) div p and micro-batch (k div p·v)·p +
// k mod p, its k-th backward the same micro-batch of chunk v−1 − (k mod
// p·v) div p: p micro-batches of a chunk, then the next chunk's. It runs
// 2(p−s−1) + (v−1)p forwards of warm-up (all m·v at most), then one F one
// B (each B with its W), then the cool-down's Bs.
func interleaved(p, m, v int) [][]Action {
	at := func(k int, back bool) Action {
		c := k % (p * v) / p
		if back {
			c = v - 1 - c
		}
		return Action{MB: k/(p*v)*p + k%p, Chunk: c}
	}
	n := m * v
	out := make([][]Action, p)
	for s := range out {
		warm := min(2*(p-s-1)+(v-1)*p, n)
		f := func(k int) {
			a := at(k, false)
			a.Op = 'F'
			out[s] = append(out[s], a)
		}
		b := func(k int) {
			a := at(k, true)
			a.Op = 'B'
			w := a
			w.Op = 'W'
			out[s] = append(out[s], a, w)
		}
		for k := 0; k < warm; k++ {
			f(k)
		}
		for k := 0; k < n; k++ {
			if warm+k < n {
				f(warm + k)
			}
			b(k)
		}
	}
	return out
}

// zbH1 builds ZB-H1's orders by running the stages at unit costs (F = B = W
// = 1, no send time). Each stage takes its F and B in 1F1B's order (p−s−1
// forwards of warm-up, then one F one B), but its Ws apart: whenever the
// next F or B cannot start (its input has not arrived, or an F would make
// the stage hold more than p micro-batches: 1F1B's peak, that of its stage
// 0; a micro-batch is held from its F to its W), the stage runs its oldest
// waiting W instead, and the Ws left after its last B close its order. So
// the Ws fill the slots where 1F1B waits, the later stages hold more
// micro-batches than in 1F1B but none more than p, and the activation
// gradients run down the pipeline without waiting for a W.
func zbH1(p, m int) [][]Action {
	fb := oneF1B(p, m)
	pos := make([]int, p)
	return atUnitCosts(p, m, "zb-h1", func(u *unitRun, s, t int) (Action, bool) {
		for pos[s] < len(fb[s]) && fb[s][pos[s]].Op == 'W' {
			pos[s]++ // 1F1B's Ws: this order places its own
		}
		if pos[s] < len(fb[s]) {
			next := fb[s][pos[s]]
			if next.Op == 'F' && u.canF(s, next.MB, t, p) || next.Op == 'B' && u.canB(s, next.MB, t) {
				pos[s]++
				return next, true
			}
		}
		return u.oldestW(s)
	})
}

// zbH2 builds the orders of ZB-H2's memory by running the stages at unit
// costs, each stage taking, whenever it is free, the first of: the B of its
// oldest micro-batch past F, once its gradient has arrived (B runs at once:
// the stages before wait for it); its next F, once the activation has
// arrived and while the stage holds fewer than 2p−1 micro-batches; its
// oldest waiting W. So a stage runs ahead with forwards where ZB-H1's
// waits for its first gradient, and defers every W to where it has nothing
// else to run. Fs and Bs go in micro-batch order on every stage, as the
// sends between stages need. At unit costs its step is ZB-H1's (both at the
// bound 3m+p−1 once m ≥ p); where B costs more than W it is shorter
// (TestZBH2).
func zbH2(p, m int) [][]Action {
	nf, nb := make([]int, p), make([]int, p)
	return atUnitCosts(p, m, "zb-h2", func(u *unitRun, s, t int) (Action, bool) {
		switch {
		case nb[s] < nf[s] && u.canB(s, nb[s], t):
			nb[s]++
			return Action{Op: 'B', MB: nb[s] - 1}, true
		case nf[s] < m && u.canF(s, nf[s], t, 2*p-1):
			nf[s]++
			return Action{Op: 'F', MB: nf[s] - 1}, true
		}
		return u.oldestW(s)
	})
}

// unitRun is the state of stages run at unit costs (F = B = W = 1, no send
// time) in lockstep, as atUnitCosts runs them.
type unitRun struct {
	p int
	// end[s][k][i]: the unit time stage s's F (k 0) or B (k 1) of
	// micro-batch i ends; 0 before it runs (no action ends at 0).
	end   [][2][]int
	held  []int   // micro-batches held per stage: from F to W
	waitW [][]int // per stage, the micro-batches whose B ran and W waits
}

func (u *unitRun) done(s, k, i, t int) bool { return u.end[s][k][i] > 0 && u.end[s][k][i] <= t }

// canF says whether stage s may run F of micro-batch mb at time t: its
// activation has arrived and the stage holds fewer than limit.
func (u *unitRun) canF(s, mb, t, limit int) bool {
	return (s == 0 || u.done(s-1, 0, mb, t)) && u.held[s] < limit
}

// canB says whether stage s may run B of micro-batch mb at time t: its F
// ran and its gradient has arrived.
func (u *unitRun) canB(s, mb, t int) bool {
	return u.done(s, 0, mb, t) && (s == u.p-1 || u.done(s+1, 1, mb, t))
}

// oldestW is stage s's oldest waiting W, if any.
func (u *unitRun) oldestW(s int) (Action, bool) {
	if len(u.waitW[s]) == 0 {
		return Action{}, false
	}
	return Action{Op: 'W', MB: u.waitW[s][0]}, true
}

// atUnitCosts runs p stages of m micro-batches at unit costs: at each unit
// of time every free stage takes the action pick gives it (false: it
// waits), the stages in order, each seeing what ended by then. It returns
// the orders the stages ran.
func atUnitCosts(p, m int, name string, pick func(u *unitRun, s, t int) (Action, bool)) [][]Action {
	u := &unitRun{p: p, end: make([][2][]int, p), held: make([]int, p), waitW: make([][]int, p)}
	for s := range u.end {
		u.end[s] = [2][]int{make([]int, m), make([]int, m)}
	}
	out := make([][]Action, p)
	busy := make([]int, p)
	for left, t := 3*p*m, 0; left > 0; t++ {
		if t > 3*p*m+2*p {
			// The orders finish by 1F1B's step, 3(m+p−1), at the latest
			// (a W never blocks the order of F and B): running past it is
			// a bug, not an input.
			panic(fmt.Sprintf("pipeline: %s at p=%d, m=%d made no progress", name, p, m))
		}
		for s := 0; s < p; s++ {
			if busy[s] > t {
				continue
			}
			a, ok := pick(u, s, t)
			if !ok {
				continue
			}
			switch a.Op {
			case 'F':
				u.held[s]++
				u.end[s][0][a.MB] = t + 1
			case 'B':
				u.waitW[s] = append(u.waitW[s], a.MB)
				u.end[s][1][a.MB] = t + 1
			case 'W':
				u.waitW[s] = u.waitW[s][1:]
				u.held[s]-- // freed at t+1, before the stage's next action
			}
			out[s] = append(out[s], a)
			busy[s] = t + 1
			left--
		}
	}
	return out
}

// Check holds sched to the rules of a pipeline of p stages and m
// micro-batches: one order per stage; every (stage, chunk, micro-batch) has
// exactly one F, one B and one W, the chunks 0..v−1 on every stage (v the
// largest chunk named, plus one); within a stage F comes before B and B
// before W of the same micro-batch and chunk; and the stages can run their
// orders to the end given the dependencies across stages (F of virtual
// stage u = c·p+s after F of u−1, B of u after B of u+1, the last's after
// its own F): Check runs them, each stage taking its next action once what
// it needs is done, and names where they stop if they deadlock.
func Check(sched [][]Action, p, m int) error {
	if p < 1 || m < 1 {
		return fmt.Errorf("%w: %d stages and %d micro-batches: each must be at least 1", ErrSchedule, p, m)
	}
	if len(sched) != p {
		return fmt.Errorf("%w: %d orders for %d stages", ErrSchedule, len(sched), p)
	}
	v := Chunks(sched)
	for s, order := range sched {
		var seen [3][]bool // per chunk and micro-batch: c·m + mb
		for k := range seen {
			seen[k] = make([]bool, m*v)
		}
		for n, a := range order {
			k := opIndex(a.Op)
			if k < 0 {
				return fmt.Errorf("%w: stage %d, action %d: op %q: want F, B or W", ErrSchedule, s, n, a.Op)
			}
			if a.MB < 0 || a.MB >= m {
				return fmt.Errorf("%w: stage %d, action %d: %v: micro-batch out of 0..%d", ErrSchedule, s, n, a, m-1)
			}
			if a.Chunk < 0 {
				return fmt.Errorf("%w: stage %d, action %d: %v: chunk %d", ErrSchedule, s, n, a, a.Chunk)
			}
			i := a.Chunk*m + a.MB
			if seen[k][i] {
				return fmt.Errorf("%w: stage %d, action %d: a second %v", ErrSchedule, s, n, a)
			}
			if k > 0 && !seen[k-1][i] {
				return fmt.Errorf("%w: stage %d, action %d: %v before %v", ErrSchedule, s, n, a, Action{"FBW"[k-1], a.MB, a.Chunk})
			}
			seen[k][i] = true
		}
		for k := range seen {
			for i, ok := range seen[k] {
				if !ok {
					return fmt.Errorf("%w: stage %d has no %v", ErrSchedule, s, Action{"FBW"[k], i % m, i / m})
				}
			}
		}
	}
	// Run the orders: a stage takes its next action once its dependencies
	// across stages are done (its own order covers those within the stage).
	pos := make([]int, p)
	did := make([][2][]bool, p) // F and B done, per stage, chunk and micro-batch
	for s := range did {
		did[s] = [2][]bool{make([]bool, m*v), make([]bool, m*v)}
	}
	done := func(s, c, k, i int) bool { return did[s][k][c*m+i] }
	for moved := true; moved; {
		moved = false
		for s := 0; s < p; s++ {
			for pos[s] < len(sched[s]) {
				a := sched[s][pos[s]]
				if !crossReady(a, s, p, v, done) {
					break
				}
				if k := opIndex(a.Op); k < 2 {
					did[s][k][a.Chunk*m+a.MB] = true
				}
				pos[s]++
				moved = true
			}
		}
	}
	var stuck []string
	for s := range sched {
		if pos[s] < len(sched[s]) {
			a := sched[s][pos[s]]
			stuck = append(stuck, fmt.Sprintf("stage %d at %v (waits for %s)", s, a, needs(a, s, p)))
		}
	}
	if stuck != nil {
		return fmt.Errorf("%w: deadlock: %s", ErrSchedule, strings.Join(stuck, "; "))
	}
	return nil
}

// Chunks is the number of chunks sched's stages hold: its largest chunk
// plus one (1 for none).
func Chunks(sched [][]Action) int {
	v := 1
	for _, order := range sched {
		for _, a := range order {
			v = max(v, a.Chunk+1)
		}
	}
	return v
}

// opIndex is 0, 1, 2 for F, B, W; -1 otherwise.
func opIndex(op byte) int { return strings.IndexByte("FBW", op) }

// crossReady says whether a's dependencies on other stages (on stage s of
// p, v chunks each) are done (done(s, c, k, i): stage s's F (k 0) or B (k
// 1) of micro-batch i in chunk c).
func crossReady(a Action, s, p, v int, done func(s, c, k, i int) bool) bool {
	u := Virtual(p, s, a.Chunk)
	switch {
	case a.Op == 'F' && u > 0:
		q, c := Place(p, u-1)
		return done(q, c, 0, a.MB)
	case a.Op == 'B' && u < p*v-1:
		q, c := Place(p, u+1)
		return done(q, c, 1, a.MB)
	}
	return true
}

// needs names what a (on stage s of p) waits for on another stage.
func needs(a Action, s, p int) string {
	op, w := byte('F'), Virtual(p, s, a.Chunk)-1
	if a.Op != 'F' {
		op, w = 'B', w+2
	}
	q, c := Place(p, w)
	return fmt.Sprintf("%v of stage %d", Action{op, a.MB, c}, q)
}

// MaxChunks bounds the chunks per stage (ChunksOf).
const MaxChunks = 64

// ChunksOf is the chunks per stage of --pp-chunks n (0: the default) under
// kind: 2 by default under Interleaved, else 1; more than 1 only under
// Interleaved. The errors name the flag --pp-chunks.
func ChunksOf(kind Kind, n int) (int, error) {
	switch {
	case n < 0 || n > MaxChunks:
		return 0, fmt.Errorf("--pp-chunks %d: want 1 to %d chunks per stage", n, MaxChunks)
	case n == 0 && kind == Interleaved:
		return 2, nil
	case n == 0:
		return 1, nil
	case n > 1 && kind != Interleaved:
		return 0, fmt.Errorf("--pp-chunks %d: only --schedule interleaved runs more than one chunk per stage", n)
	}
	return n, nil
}

// MicroBatchesFit refuses m micro-batches the kind cannot run on p stages:
// the interleaved schedule's must be a multiple of p. The error names the
// flag --micro-batches.
func (k Kind) MicroBatchesFit(p, m int) error {
	if k == Interleaved && p > 0 && m%p != 0 {
		return fmt.Errorf("--micro-batches %d: the interleaved schedule wants a multiple of pp=%d", m, p)
	}
	return nil
}

// MaxStageLayers bounds a stage's layers in StageLayers' spec.
const MaxStageLayers = 1 << 16

// SplitCost is what a split of a model's blocks into stages balances: one
// block's cost, and what the first stage (the embeddings) and the last (the
// head and the loss) add; any unit. The zero value prices every block 1 and
// nothing else.
type SplitCost struct{ Block, First, Last float64 }

// TransformerSplitCost prices a transformer's stages by a forward's
// multiply-adds per token (the backward scales alike): a block its
// projections and MLP (4·D² + 2·D·ffn weights) and its attention over a
// causal context (C·D), the first stage its embeddings (2·D), the last
// its head and loss (V·D + 5·V + 5·D). The GPT's default split and
// `launcher plan --vocab` use it.
func TransformerSplitCost(hidden, ffn, context, vocab int) SplitCost {
	d, f, c, v := float64(hidden), float64(ffn), float64(context), float64(vocab)
	return SplitCost{Block: 4*d*d + 2*d*f + c*d, First: 2 * d, Last: v*d + 5*v + 5*d}
}

// StageLayers splits a model of layers blocks into pp stages of chunks
// chunks each, pp·chunks virtual stages (in order: virtual stage c·pp+s is
// stage s's chunk c): as spec says ("3,3,1,1": each virtual stage's,
// summing to layers unless layers is 0), or balanced (Balance) under cost;
// layers 0 without spec is one per virtual stage. Every virtual stage has
// at least one layer. The errors name the flags --pp-layers
// and --layers, which take these values.
func StageLayers(layers, pp, chunks int, spec string, cost SplitCost) ([]int, error) {
	n := pp * chunks // the virtual stages
	what, want, on := "stage", fmt.Sprintf("pp = %d", pp), fmt.Sprintf("pp=%d", pp)
	if chunks > 1 {
		what, want, on = "virtual stage", fmt.Sprintf("pp × chunks = %d", n), fmt.Sprintf("pp=%d with %d chunks a stage", pp, chunks)
	}
	var per []int
	if spec != "" {
		sum := 0
		for _, f := range strings.Split(spec, ",") {
			k, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || k < 0 || k > MaxStageLayers {
				return nil, fmt.Errorf("--pp-layers %s: %q is not a number of layers", spec, f)
			}
			if k == 0 {
				return nil, fmt.Errorf("--pp-layers %s: %s %d has no layer", spec, what, len(per))
			}
			per, sum = append(per, k), sum+k
		}
		if len(per) != n {
			return nil, fmt.Errorf("--pp-layers %s: %d stages, want %s", spec, len(per), want)
		}
		if layers != 0 && sum != layers {
			return nil, fmt.Errorf("--pp-layers %s: %d layers, want --layers %d", spec, sum, layers)
		}
		return per, nil
	}
	if layers == 0 {
		layers = n
	}
	if layers < n {
		return nil, fmt.Errorf("--layers %d on %s: a %s would have no layer", layers, on, what)
	}
	return Balance(layers, n, cost), nil
}

// Balance splits layers blocks (at least pp) into pp stages of at least one
// each so that the costliest stage (its blocks, and the first's and the
// last's extras) costs least; among such splits, the first stages take
// fewer blocks (under 1F1B the first stage holds the most micro-batches at
// once). With equal stages and no extras: layers/pp each, the last
// layers mod pp one more.
func Balance(layers, pp int, cost SplitCost) []int {
	b := cost.Block
	if !(b > 0) {
		b = 1
	}
	extra := func(s int) float64 {
		e := 0.0
		if s == 0 {
			e += max(cost.First, 0)
		}
		if s == pp-1 {
			e += max(cost.Last, 0)
		}
		return e
	}
	// caps are the most blocks each stage takes under a bound t.
	caps := func(t float64) ([]int, int) {
		c, sum := make([]int, pp), 0
		for s := range pp {
			c[s] = int(math.Floor((t - extra(s)) / b * (1 + 1e-12)))
			c[s] = min(c[s], layers-(pp-1))
			sum += c[s]
		}
		return c, sum
	}
	feasible := func(c []int, sum int) bool {
		for _, n := range c {
			if n < 1 {
				return false
			}
		}
		return sum >= layers
	}
	// The bound is some stage's cost: n blocks and its extras.
	var cands []float64
	for s := range pp {
		for n := 1; n <= layers-(pp-1); n++ {
			cands = append(cands, float64(n)*b+extra(s))
		}
	}
	slices.Sort(cands)
	i := sort.Search(len(cands), func(i int) bool { return feasible(caps(cands[i])) })
	c, sum := caps(cands[min(i, len(cands)-1)])
	for s := 0; sum > layers; s = (s + 1) % pp { // the surplus off the first stages
		if c[s] > 1 {
			c[s]--
			sum--
		}
	}
	return c
}
