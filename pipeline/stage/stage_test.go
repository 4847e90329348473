package stage_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/job"
	"github.com/meshrun/meshrun/pipeline"
	"github.com/meshrun/meshrun/pipeline/stage"
	"github.com/meshrun/meshrun/tensor"
)

const width = 8

// rows is micro-batch mb's rows: micro-batches of different sizes.
func rows(mb int) int { return 2 + mb%3 }

func shape(mb int) []int { return []int{rows(mb), width} }

// toy is the model: p linear maps y = x·W_sᵀ, W_s [width, width]; the loss
// Σ y⊙dy for a fixed dy per micro-batch, so the last stage's output gradient
// is dy. Inputs and weights are drawn once per seed.
type toy struct {
	p, m int
	w    [][]float64   // per stage
	x    [][]float64   // stage 0's input per micro-batch
	dy   [][]float64   // the loss's gradient per micro-batch
	dw   [][]float64   // reference: per stage, accumulated
	dx   [][]float64   // reference: stage 0's input gradient per micro-batch
	out  [][]float64   // reference: the last stage's output per micro-batch
	acts [][][]float64 // reference: stage s's input per micro-batch
}

func randoms(r *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = 2*r.Float64() - 1
	}
	return v
}

// newToy draws the model and computes the reference in float64, from
// float32-rounded data (what the stages start from).
func newToy(p, m int, seed uint64) *toy {
	r := rand.New(rand.NewPCG(seed, 1))
	round := func(v []float64) []float64 {
		for i := range v {
			v[i] = float64(float32(v[i]))
		}
		return v
	}
	t := &toy{p: p, m: m}
	for s := 0; s < p; s++ {
		t.w = append(t.w, round(randoms(r, width*width)))
		t.dw = append(t.dw, make([]float64, width*width))
	}
	for mb := 0; mb < m; mb++ {
		n := rows(mb)
		t.x = append(t.x, round(randoms(r, n*width)))
		t.dy = append(t.dy, round(randoms(r, n*width)))
		xs := [][]float64{t.x[mb]}
		for s := 0; s < p; s++ {
			xs = append(xs, forward(xs[s], t.w[s], n))
		}
		t.out = append(t.out, xs[p])
		g := t.dy[mb]
		for s := p - 1; s >= 0; s-- {
			weightGrad(t.dw[s], g, xs[s], n)
			g = inputGrad(g, t.w[s], n)
		}
		t.dx = append(t.dx, g)
	}
	return t
}

// forward is y = x·Wᵀ on n rows.
func forward[T float32 | float64](x, w []T, n int) []T {
	y := make([]T, n*width)
	for r := 0; r < n; r++ {
		for i := 0; i < width; i++ {
			var acc T
			for j := 0; j < width; j++ {
				acc += x[r*width+j] * w[i*width+j]
			}
			y[r*width+i] = acc
		}
	}
	return y
}

// inputGrad is dx = dy·W.
func inputGrad[T float32 | float64](dy, w []T, n int) []T {
	dx := make([]T, n*width)
	for r := 0; r < n; r++ {
		for j := 0; j < width; j++ {
			var acc T
			for i := 0; i < width; i++ {
				acc += dy[r*width+i] * w[i*width+j]
			}
			dx[r*width+j] = acc
		}
	}
	return dx
}

// weightGrad adds dyᵀ·x to dw.
func weightGrad[T float32 | float64](dw, dy, x []T, n int) {
	for i := 0; i < width; i++ {
		for j := 0; j < width; j++ {
			var acc T
			for r := 0; r < n; r++ {
				acc += dy[r*width+i] * x[r*width+j]
			}
			dw[i*width+j] += acc
		}
	}
}

func to32(v []float64) []float32 {
	o := make([]float32, len(v))
	for i, x := range v {
		o[i] = float32(x)
	}
	return o
}

// linear is stage s of the toy model in float32, keeping what its backwards
// need per micro-batch.
type linear struct {
	t    *toy
	s    int
	w    []float32
	dw   []float32
	x    map[int][]float32 // saved inputs, F to W
	g    map[int][]float32 // saved output gradients, B to W
	dx   map[int][]float32 // stage 0: input gradients
	out  map[int][]float32 // the last stage: outputs
	fail func(op byte, mb int) error
}

func newLinear(t *toy, s int) *linear {
	return &linear{t: t, s: s, w: to32(t.w[s]), dw: make([]float32, width*width),
		x: map[int][]float32{}, g: map[int][]float32{}, dx: map[int][]float32{}, out: map[int][]float32{}}
}

func (l *linear) failing(op byte, mb int) error {
	if l.fail == nil {
		return nil
	}
	return l.fail(op, mb)
}

func (l *linear) Forward(_ context.Context, mb int, in *tensor.Tensor) (*tensor.Tensor, error) {
	if err := l.failing('F', mb); err != nil {
		return nil, err
	}
	x := to32(l.t.x[mb])
	if l.s > 0 {
		if in == nil {
			return nil, fmt.Errorf("F%d: no input", mb)
		}
		x = in.Float32()
	}
	l.x[mb] = x
	y := forward(x, l.w, rows(mb))
	if l.s == l.t.p-1 {
		l.out[mb] = y
	}
	return tensor.FromFloat32(y, shape(mb)...)
}

func (l *linear) BackwardInput(_ context.Context, mb int, dout *tensor.Tensor) (*tensor.Tensor, error) {
	if err := l.failing('B', mb); err != nil {
		return nil, err
	}
	g := to32(l.t.dy[mb])
	if l.s < l.t.p-1 {
		if dout == nil {
			return nil, fmt.Errorf("B%d: no gradient", mb)
		}
		g = dout.Float32()
	}
	if _, ok := l.x[mb]; !ok {
		return nil, fmt.Errorf("B%d before F%d", mb, mb)
	}
	l.g[mb] = g
	dx := inputGrad(g, l.w, rows(mb))
	if l.s == 0 {
		l.dx[mb] = dx
	}
	return tensor.FromFloat32(dx, shape(mb)...)
}

func (l *linear) BackwardWeight(_ context.Context, mb int) error {
	if err := l.failing('W', mb); err != nil {
		return err
	}
	x, g := l.x[mb], l.g[mb]
	if x == nil || g == nil {
		return fmt.Errorf("W%d before B%d", mb, mb)
	}
	weightGrad(l.dw, g, x, rows(mb))
	delete(l.x, mb)
	delete(l.g, mb)
	return nil
}

// relErr is max |got − want| / max |want|.
func relErr(got []float32, want []float64) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var d, n float64
	for i := range want {
		d = max(d, math.Abs(float64(got[i])-want[i]))
		n = max(n, math.Abs(want[i]))
	}
	return d / n
}

// result is one stage's end of a run.
type result struct {
	st      *linear
	tr      stage.Trace
	err     error
	elapsed time.Duration
}

// runAll runs kind's schedule for the toy on p in-process ranks; setup may
// change a stage before it runs.
func runAll(t *testing.T, ctx context.Context, kind pipeline.Kind, tm *toy, setup func(*linear)) ([]result, error) {
	t.Helper()
	sched, err := pipeline.Schedule(kind, tm.p, tm.m)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]result, tm.p)
	var mu sync.Mutex
	err = job.InProcess(ctx, tm.p, func(ctx context.Context, w *collective.World) error {
		g, err := w.WorldGroup(ctx)
		if err != nil {
			return err
		}
		l := newLinear(tm, g.Index())
		if setup != nil {
			setup(l)
		}
		start := time.Now()
		tr, err := stage.Run(ctx, g, kind, sched, l, shape)
		mu.Lock()
		out[g.Index()] = result{st: l, tr: tr, err: err, elapsed: time.Since(start)}
		mu.Unlock()
		return err
	})
	return out, err
}

// TestSchedulesMatchReference: every schedule on 4 stages, m = 2, 4 and 8
// (m < p included): the weight gradients accumulated over the micro-batches,
// stage 0's input gradients and the last stage's outputs match the float64
// reference within 1e-5 relative; the trace's order is the schedule's; the
// peak activations are what the order implies (pipeline.Simulate's peak):
// GPipe m on every stage, 1F1B min(p−s, m) on stage s, ZB-H1 at most p,
// ZB-H2 at most 2p−1.
func TestSchedulesMatchReference(t *testing.T) {
	const p = 4
	for _, kind := range []pipeline.Kind{pipeline.GPipe, pipeline.OneF1B, pipeline.ZBH1, pipeline.ZBH2} {
		for _, m := range []int{2, 4, 8} {
			name := fmt.Sprintf("%v/m=%d", kind, m)
			tm := newToy(p, m, uint64(10*m+int(kind)))
			res, err := runAll(t, context.Background(), kind, tm, nil)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			sched, _ := pipeline.Schedule(kind, p, m)
			model, err := pipeline.Run(kind, p, m, pipeline.Cost{F: 1, B: 1, W: 1})
			if err != nil {
				t.Fatal(err)
			}
			for s, r := range res {
				if e := relErr(r.st.dw, tm.dw[s]); e > 1e-5 {
					t.Errorf("%s stage %d: dW off by %g relative", name, s, e)
				}
				if got := r.tr.Actions(); !slices.Equal(got, sched[s]) {
					t.Errorf("%s stage %d: ran %v, scheduled %v", name, s, got, sched[s])
				}
				if len(r.st.x)+len(r.st.g) != 0 {
					t.Errorf("%s stage %d: %d inputs and %d gradients left", name, s, len(r.st.x), len(r.st.g))
				}
				checkTrace(t, name, r.tr)
				peak := r.tr.Peak
				if peak != model.Peak[s] {
					t.Errorf("%s stage %d: peak activations %d, the order implies %d", name, s, peak, model.Peak[s])
				}
				switch kind {
				case pipeline.GPipe:
					if peak != m {
						t.Errorf("%s stage %d: peak %d, want m", name, s, peak)
					}
				case pipeline.OneF1B:
					if peak != min(p-s, m) {
						t.Errorf("%s stage %d: peak %d, want min(p−s, m) = %d", name, s, peak, min(p-s, m))
					}
				case pipeline.ZBH1:
					if peak > p {
						t.Errorf("%s stage %d: peak %d, want at most p", name, s, peak)
					}
				case pipeline.ZBH2:
					if peak > 2*p-1 {
						t.Errorf("%s stage %d: peak %d, want at most 2p−1", name, s, peak)
					}
				}
				wantMsgs := 2 * m
				if s == 0 || s == p-1 {
					wantMsgs = m
				}
				if r.tr.Sent != wantMsgs || r.tr.Received != wantMsgs {
					t.Errorf("%s stage %d: sent %d, received %d; want %d each", name, s, r.tr.Sent, r.tr.Received, wantMsgs)
				}
				// Each send recorded: an F's activation forward, a B's
				// gradient back, after the action that made it ended.
				ends := map[pipeline.Action]time.Duration{}
				for _, e := range r.tr.Events {
					ends[e.Action] = e.End
				}
				if len(r.tr.Sends) != r.tr.Sent {
					t.Errorf("%s stage %d: %d sends recorded, %d sent", name, s, len(r.tr.Sends), r.tr.Sent)
				}
				for _, x := range r.tr.Sends {
					if to := map[byte]int{'F': s + 1, 'B': s - 1}[x.Op]; x.To != to || x.Start < ends[x.Action] || x.End < x.Start {
						t.Errorf("%s stage %d: send %+v (its action ended at %v)", name, s, x, ends[x.Action])
					}
				}
			}
			for mb := 0; mb < m; mb++ {
				if e := relErr(res[0].st.dx[mb], tm.dx[mb]); e > 1e-5 {
					t.Errorf("%s micro-batch %d: stage 0's input gradient off by %g relative", name, mb, e)
				}
				if e := relErr(res[p-1].st.out[mb], tm.out[mb]); e > 1e-5 {
					t.Errorf("%s micro-batch %d: the output off by %g relative", name, mb, e)
				}
			}
		}
	}
}

// checkTrace: the events follow each other, and busy + idle is the step.
func checkTrace(t *testing.T, name string, tr stage.Trace) {
	t.Helper()
	var prev time.Duration
	for i, e := range tr.Events {
		if e.Start < prev || e.End < e.Start || e.Wait < 0 || e.Start-e.Wait < prev {
			t.Errorf("%s stage %d: event %d (%v) at %v..%v, waited %v, after %v", name, tr.Stage, i, e.Action, e.Start, e.End, e.Wait, prev)
		}
		prev = e.End
	}
	if tr.Overhead < 0 || tr.Overhead > tr.Idle {
		t.Errorf("%s stage %d: overhead %v, idle %v", name, tr.Stage, tr.Overhead, tr.Idle)
	}
	if tr.Busy+tr.Idle != tr.Makespan || tr.Makespan != prev || tr.Total < tr.Makespan || tr.Bubble < 0 || tr.Bubble > 1 {
		t.Errorf("%s: %v (total %v)", name, tr, tr.Total)
	}
	if !strings.HasPrefix(tr.String(), fmt.Sprintf("stage %d (%v): %d actions", tr.Stage, tr.Kind, len(tr.Events))) {
		t.Errorf("%s: %q", name, tr)
	}
}

var errBoom = errors.New("boom")

// TestStageFails: stage 2's BackwardInput fails on micro-batch 1. Run
// returns that error on stage 2; every other stage fails within seconds
// (not at the 60 s data timeout) with the collective layer's error, which
// names rank 2.
func TestStageFails(t *testing.T) {
	for _, kind := range []pipeline.Kind{pipeline.OneF1B, pipeline.ZBH1} {
		tm := newToy(4, 4, 7)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		res, err := runAll(t, ctx, kind, tm, func(l *linear) {
			if l.s == 2 {
				l.fail = func(op byte, mb int) error {
					if op == 'B' && mb == 1 {
						return errBoom
					}
					return nil
				}
			}
		})
		cancel()
		if err == nil {
			t.Fatalf("%v: the run did not fail", kind)
		}
		for s, r := range res {
			switch {
			case s == 2 && (!errors.Is(r.err, errBoom) || !strings.Contains(r.err.Error(), "stage 2: B1: boom")):
				t.Errorf("%v stage 2: %v, want its own error", kind, r.err)
			case s != 2 && (r.err == nil || collective.Culprit(r.err) != 2):
				t.Errorf("%v stage %d: %v, want the collective layer's error naming rank 2", kind, s, r.err)
			}
			if r.elapsed > 5*time.Second {
				t.Errorf("%v stage %d: failed after %v", kind, s, r.elapsed)
			}
		}
	}
}

// TestRefusals: what Run refuses before running, and a stage whose
// activation has the wrong shape.
func TestRefusals(t *testing.T) {
	sched, _ := pipeline.Schedule(pipeline.OneF1B, 2, 2)
	tm := newToy(2, 2, 3)
	err := job.InProcess(context.Background(), 2, func(ctx context.Context, w *collective.World) error {
		g, err := w.WorldGroup(ctx)
		if err != nil {
			return err
		}
		l := newLinear(tm, g.Index())
		for _, tc := range []struct {
			name  string
			sched [][]pipeline.Action
			shape func(int) []int
			is    error
			want  string
		}{
			{"three stages on two ranks", func() [][]pipeline.Action { s, _ := pipeline.Schedule(pipeline.OneF1B, 3, 2); return s }(), shape, stage.ErrInvalid, "a group of 2 for 3 stages"},
			{"no shape", sched, nil, stage.ErrInvalid, "nil group, stage or shape"},
			{"a negative shape", sched, func(int) []int { return []int{-1, width} }, stage.ErrInvalid, "shape [-1 8]"},
		} {
			if _, err := stage.Run(ctx, g, pipeline.GPipe, tc.sched, l, tc.shape); !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
				return fmt.Errorf("%s: %v, want %q", tc.name, err, tc.want)
			}
		}
		// Chunks: as many as the schedule's, on one wire.
		il, _ := pipeline.ScheduleChunks(pipeline.Interleaved, 2, 2, 2)
		for _, tc := range []struct {
			name   string
			chunks []stage.Stage
			want   string
		}{
			{"one chunk for two", []stage.Stage{l}, "a schedule of 2 chunks a stage for 1"},
			{"chunks on two wires", []stage.Stage{l, wired{l, stage.Wire{DType: tensor.BFloat16}}}, "chunks on the wires host float32 and"},
		} {
			if _, err := stage.RunChunks(ctx, g, pipeline.Interleaved, il, tc.chunks, shape); !errors.Is(err, stage.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				return fmt.Errorf("%s: %v, want %q", tc.name, err, tc.want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Stage 0 sends an activation of the wrong shape: it refuses it and
	// stage 1 fails with the collective layer's error naming rank 0.
	res := make([]error, 2)
	_ = job.InProcess(context.Background(), 2, func(ctx context.Context, w *collective.World) error {
		g, err := w.WorldGroup(ctx)
		if err != nil {
			return err
		}
		wrong := shape
		l := newLinear(tm, g.Index())
		if g.Index() == 0 {
			wrong = func(mb int) []int { return []int{rows(mb) + 1, width} }
		}
		_, res[g.Index()] = stage.Run(ctx, g, pipeline.OneF1B, sched, l, wrong)
		return res[g.Index()]
	})
	if !errors.Is(res[0], stage.ErrInvalid) || !strings.Contains(res[0].Error(), "stage 0: F0 returned an activation of shape [2 8], want [3 8]") {
		t.Errorf("stage 0: %v", res[0])
	}
	if collective.Culprit(res[1]) != 0 {
		t.Errorf("stage 1: %v, want an error naming rank 0", res[1])
	}
}

// TestMeasuredBubble: stages whose every action sleeps one unit (5 ms) on
// 4 stages and 8 micro-batches. The longest step a stage measured (each
// measures to its own last action: stage 0's is the whole step) is at least
// the model's (1F1B 33 units, ZB-H1 27) and not far above it, every stage is
// busy at least 24 units, and ZB-H1's step is shorter than 1F1B's: what ran
// follows the model.
func TestMeasuredBubble(t *testing.T) {
	if testing.Short() {
		t.Skip("sleeps")
	}
	const unit = 5 * time.Millisecond
	const p, m = 4, 8
	step := map[pipeline.Kind]time.Duration{}
	for _, kind := range []pipeline.Kind{pipeline.OneF1B, pipeline.ZBH1} {
		model, _ := pipeline.Run(kind, p, m, pipeline.Cost{F: 1, B: 1, W: 1})
		want := time.Duration(model.Makespan) * unit
		res, err := runAll(t, context.Background(), kind, newToy(p, m, 5), func(l *linear) {
			l.fail = func(byte, int) error { time.Sleep(unit); return nil }
		})
		if err != nil {
			t.Fatal(err)
		}
		for s, r := range res {
			tr := r.tr
			step[kind] = max(step[kind], tr.Makespan)
			if tr.Makespan > want*3/2+20*time.Millisecond || tr.Busy < 3*m*unit {
				t.Errorf("%v stage %d: %v; the model's step %v", kind, s, tr, want)
			}
			// Between its 24 actions the stage spends microseconds of its
			// own: its idle time (a quarter of the step and more under
			// 1F1B) is waiting for its neighbours.
			if tr.Overhead < 0 || tr.Overhead > tr.Makespan/10 {
				t.Errorf("%v stage %d: %v of its own between actions", kind, s, tr.Overhead)
			}
			c, send := tr.Costs()
			u := float64(unit) / float64(time.Millisecond)
			for _, x := range []float64{c.F, c.B, c.W} {
				if x < u || x > 2*u {
					t.Errorf("%v stage %d: median costs %+v ms, each sleeps %v ms", kind, s, c, u)
				}
			}
			if send < 0 || send > u {
				t.Errorf("%v stage %d: median send %v ms", kind, s, send)
			}
		}
		if step[kind] < want-unit {
			t.Errorf("%v: measured step %v, the model's %v", kind, step[kind], want)
		}
	}
	if step[pipeline.ZBH1] >= step[pipeline.OneF1B] {
		t.Errorf("measured steps: zb %v, 1f1b %v", step[pipeline.ZBH1], step[pipeline.OneF1B])
	}
}

// TestCosts: the medians of a trace's F, B and W, and its sends timed from
// the end of the action they carry: a fused backward's from its W's end.
func TestCosts(t *testing.T) {
	ms := time.Millisecond
	ev := func(op byte, mb int, start, end time.Duration) stage.Event {
		return stage.Event{Action: pipeline.Action{Op: op, MB: mb}, Start: start * ms, End: end * ms}
	}
	tr := stage.Trace{Events: []stage.Event{
		ev('F', 0, 0, 2), ev('F', 1, 2, 5), ev('F', 2, 5, 9),
		ev('B', 0, 9, 13), ev('W', 0, 13, 14),
		ev('B', 1, 14, 20), ev('W', 1, 20, 22),
	}, Sends: []stage.Send{
		{Action: pipeline.Action{Op: 'F', MB: 0}, Start: 2 * ms, End: 3 * ms},
		{Action: pipeline.Action{Op: 'F', MB: 1}, Start: 6 * ms, End: 8 * ms},
		{Action: pipeline.Action{Op: 'B', MB: 0}, Start: 14 * ms, End: 15 * ms},
		{Action: pipeline.Action{Op: 'B', MB: 1}, Start: 22 * ms, End: 23 * ms},
	}}
	for _, tc := range []struct {
		kind pipeline.Kind
		send float64
	}{{pipeline.ZBH1, 2.5}, {pipeline.OneF1B, 1}} {
		// Sends after F0, F1, B0, B1's ends: 1, 3, 2, 3 ms apart (zb: median
		// 2.5); fused, the gradients from W0's and W1's ends: 1, 3, 1, 1
		// (median 1).
		tr.Kind = tc.kind
		c, send := tr.Costs()
		if c != (pipeline.StageCost{F: 3, B: 5, W: 1.5}) || send != tc.send {
			t.Errorf("%v: costs %+v, send %v; want F 3, B 5, W 1.5, send %v", tc.kind, c, send, tc.send)
		}
	}
	if c, send := (stage.Trace{}).Costs(); c != (pipeline.StageCost{}) || send != 0 {
		t.Errorf("an empty trace: %+v, %v", c, send)
	}
}
