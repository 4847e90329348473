// Package linear runs sharded linear layers on one rank: the spmd plans decide
// the layouts and collectives, the kernels compute locally, the collective
// layer moves the bytes. The models built from layers (the MLP block, the
// GPT) live above it, in package models.
//
// A Layer holds this rank's shards of W[N, K] and b[N]. Forward redistributes x
// per the plan, runs one GEMM with the bias fused, and leaves y in the layout the
// consumer asked for. Backward computes only the gradients the layer needs —
// input, weight and bias are three separate kernels — and what Forward saves
// depends on them (x only for dW, W only for dx).
//
// Every tensor a layer holds (parameters, activations, saved tensors, gradients,
// scratch) lives on the rank's device and is allocated by its memory; a step
// copies nothing between host and device. Parameters come in once (SetParams),
// results go out only when asked (Gather, a dump, the loss).
//
// Besides the layer (layer.go: its config, plans and steps) the package
// holds what runs it and what a model built on layers shares with it: the
// runtime, scratch buffers and the execution of a planned move
// (runtime.go), preset layouts (presets.go), shards (shard.go), checkpoints
// of sharded parameters (ckpt.go), and a layer's check against a float64
// reference (check.go).
package linear

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// ErrConfig: a layer configuration that cannot be planned or run.
var ErrConfig = errors.New("linear: bad configuration")

// Config describes a layer: how x, W and b are laid out (B nil: no bias), the
// layout the consumer wants for y (nil: the plan's default), and which gradients
// are needed.
type Config struct {
	Name  string
	X, W  placement.Spec
	B     *placement.Spec
	Out   []placement.Placement
	Grads Grads
	// DType is the compute dtype: of x, y, dy, dx and the GEMMs (0: float32).
	// With bfloat16 the parameters stay float32 (the master copy, what SGD
	// updates), each Forward computes with bfloat16 copies of them, and weight
	// and bias gradients accumulate in float32, as Megatron's bf16 mode.
	DType tensor.DType
	// GradDType is the dtype the weight and bias gradients cross the wire in
	// when they are reduced (0: DType).
	GradDType tensor.DType
	// Planner plans the layer (nil: a placement.DefaultPlanner of its own):
	// its model, with the compute dtype's element size, prices the
	// strategies; its budget and cache are shared with whatever else it
	// plans.
	Planner *placement.Planner
}

// PlannerFor is the planner a layer computing in dt plans with: pl (nil: a
// placement.DefaultPlanner), its model pricing elements of dt's size, its
// budget and cache shared. A model built on layers plans its layers and its
// own moves with it, so that all of them price the same elements.
func PlannerFor(pl *placement.Planner, dt tensor.DType) *placement.Planner {
	if pl == nil {
		pl = placement.DefaultPlanner()
	}
	return pl.WithModel(pl.Model().WithElemBytes(dt.Size()))
}

// Compute is the compute dtype (DType, float32 by default).
func (c Config) Compute() tensor.DType {
	if c.DType == 0 {
		return tensor.Float32
	}
	return c.DType
}

// Wire is the dtype weight and bias gradients are reduced in.
func (c Config) Wire() tensor.DType {
	if c.GradDType == 0 {
		return c.Compute()
	}
	return c.GradDType
}

// Grads says which gradients a layer computes.
type Grads struct{ X, W, B bool }

// AllGrads needs every gradient.
var AllGrads = Grads{X: true, W: true, B: true}

func (g Grads) names(bias bool) []string {
	out := []string{}
	if g.X {
		out = append(out, "x")
	}
	if g.W {
		out = append(out, "w")
	}
	if g.B && bias {
		out = append(out, "b")
	}
	return out
}

// Layer is one rank's share of a sharded linear layer.
type Layer struct {
	Config
	Fwd  *spmd.Plan
	Bwd  *spmd.Backward
	rank int
	// W and B are this rank's shards, laid out as Config.W and Config.B.
	W, B *tensor.Tensor
	// DW and DB accumulate this rank's gradient terms as the backward plan
	// computes them (before their reduction); Reduce turns them into gradients
	// laid out as W and B.
	dw, db  *tensor.Tensor
	gradDW  *tensor.Tensor
	gradDB  *tensor.Tensor
	pending bool
	// wc and bc are the compute-dtype copies of W and B (bfloat16 layers);
	// under HoldCompute (hold) they are kept once cast (held).
	wc, bc     *tensor.Tensor
	hold, held bool
	fwdMoves   map[string]spmd.Move
	fusedLR    float32 // FuseSGD's learning rate, 0 when not fused
	// passDX: BackwardInput's dx goes to the workspace, not the
	// micro-batch's scratch (SetPassDX).
	passDX bool
	mem    tensor.Memory
	bufs   Scratch
	// work is the layer's own workspace, whatever scratch SetScratch
	// gives it: what no micro-batch keeps past its own pass (the
	// parameters in the compute dtype and their moves, which a step's
	// micro-batches share; a whole backward's dx, moved dy and moved saved
	// operands; the reductions' buffers).
	work Scratch
}

// SetScratch makes the layer take what a micro-batch keeps from s: its
// output, its moved input (Saved), BackwardInput's dx and kept dy; it
// returns the scratch it used before. A pipeline stage holding several
// micro-batches in flight gives each its own (the layer's Saved refers into
// it until the micro-batch's backward). The rest, shared by the
// micro-batches, stays in the layer's workspace (WorkBytes).
func (l *Layer) SetScratch(s Scratch) Scratch {
	old := l.bufs
	l.bufs = s
	return old
}

// SetPassDX says that BackwardInput's callers are done with its dx before
// the next micro-batch's backward (they pass it on, not keep it for a
// weight half): it then goes to the layer's workspace, not the
// micro-batch's scratch, which a pipeline stage holds once per micro-batch
// in flight. Backward's dx always does.
func (l *Layer) SetPassDX(pass bool) { l.passDX = pass }

// FuseSGD makes Backward apply the SGD update W -= lr·dW inside the weight
// gradient's GEMM (alpha = -lr, beta = 1) instead of producing dW: no dW buffer,
// no separate pass over W. It applies only when dW needs no collective (its
// terms are complete on this rank) and reports whether it does; a fused layer
// takes one micro-batch per step, and Reduce then returns no dW.
func (l *Layer) FuseSGD(lr float32) bool {
	for _, g := range l.Bwd.Grads {
		if g.Input == "w" && !movesBytes(moveOf(g.Plan, g.Output.Name)) && slices.Equal(l.W.Shape(), g.Output.Spec.LocalShape(l.rank)) {
			l.fusedLR = lr
			return true
		}
	}
	return false
}

// Plans are a layer's forward and backward plans, the same on every rank.
type Plans struct {
	Fwd *spmd.Plan
	Bwd *spmd.Backward
}

// New plans the layer for rank and allocates its parameter shards (zeros) in
// mem, the rank's device memory (nil: host memory).
func New(cfg Config, rank int, mem tensor.Memory) (*Layer, error) {
	p, err := Plan(cfg)
	if err != nil {
		return nil, err
	}
	return NewPlanned(cfg, p, rank, mem)
}

// Plan plans a layer: the forward and the backward of the gradients it needs.
func Plan(cfg Config) (Plans, error) { return PlanContext(context.Background(), cfg) }

// PlanContext is Plan within ctx: planning stops once ctx is done, and the
// forward and backward share cfg.Planner's budget and cache.
func PlanContext(ctx context.Context, cfg Config) (Plans, error) {
	pl := PlannerFor(cfg.Planner, cfg.Compute())
	op := "linear"
	inputs := []spmd.Operand{{Name: "x", Spec: cfg.X}, {Name: "w", Spec: cfg.W}}
	if cfg.B != nil {
		inputs = append(inputs, spmd.Operand{Name: "b", Spec: *cfg.B})
	} else {
		op = "linear_nobias"
	}
	grads := cfg.Grads.names(cfg.B != nil)
	fwd, err := spmd.ForwardWith(ctx, pl, spmd.Request{Op: op, Inputs: inputs, Options: spmd.Options{Out: cfg.Out, Grads: grads}})
	if err != nil {
		return Plans{}, fmt.Errorf("linear %s: %w", cfg.Name, err)
	}
	bwd, err := spmd.BackwardOfWith(ctx, pl, fwd, grads, nil)
	if err != nil {
		return Plans{}, fmt.Errorf("linear %s: %w", cfg.Name, err)
	}
	// The layer has no kernel to scale a gradient by: a P(avg) x or output
	// (whose gradients the plan scales) is refused rather than run wrong.
	for _, g := range bwd.Grads {
		if g.Scale != 1 {
			return Plans{}, fmt.Errorf("%w: linear %s: d%s must be scaled by %s on every rank (a P(avg) input or output); the layer takes P(sum) partials only",
				ErrConfig, cfg.Name, g.Input, spmd.FormatScale(g.Scale))
		}
	}
	return Plans{fwd, bwd}, nil
}

// NewPlanned builds rank's layer from plans made by Plan(cfg), its parameter
// shards (zeros) allocated in mem (nil: host memory).
func NewPlanned(cfg Config, p Plans, rank int, mem tensor.Memory) (*Layer, error) {
	fwd, bwd := p.Fwd, p.Bwd
	if rank < 0 || rank >= cfg.X.Mesh.Size() {
		return nil, fmt.Errorf("%w: rank %d outside mesh %s", ErrConfig, rank, cfg.X.Mesh)
	}
	for _, dt := range []tensor.DType{cfg.Compute(), cfg.Wire()} {
		if dt != tensor.Float32 && dt != tensor.BFloat16 {
			return nil, fmt.Errorf("%w: linear %s: dtype %v (want float32 or bfloat16)", ErrConfig, cfg.Name, dt)
		}
	}
	if mem == nil {
		mem = tensor.Host
	}
	l := &Layer{Config: cfg, Fwd: fwd, Bwd: bwd, rank: rank, fwdMoves: map[string]spmd.Move{}, mem: mem, bufs: Scratch{}, work: Scratch{}}
	for _, m := range fwd.Moves {
		l.fwdMoves[m.Tensor] = m
	}
	var err error
	if l.W, err = mem.Alloc(tensor.Float32, cfg.W.LocalShape(rank)...); err != nil {
		return nil, err
	}
	if cfg.B != nil {
		if l.B, err = mem.Alloc(tensor.Float32, cfg.B.LocalShape(rank)...); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// SetParams sets the layer's parameter shards from host tensors (b nil when the
// layer has no bias), copying them to the layer's device.
func (l *Layer) SetParams(w, b *tensor.Tensor) error {
	if err := checkShape("w", w, l.Config.W, l.rank, tensor.Float32); err != nil {
		return err
	}
	if (b == nil) != (l.B == nil) {
		return fmt.Errorf("%w: linear %s: bias given %v, layer has one %v", ErrConfig, l.Name, b != nil, l.B != nil)
	}
	if b != nil {
		if err := checkShape("b", b, *l.Config.B, l.rank, tensor.Float32); err != nil {
			return err
		}
	}
	var err error
	l.held = false // new parameters: cast them at the next Forward
	if l.W, err = tensor.Upload(l.mem, w); err != nil {
		return err
	}
	if b != nil {
		l.B, err = tensor.Upload(l.mem, b)
	}
	return err
}

// Saved is what Forward keeps for Backward: x as the GEMM used it (only when dW
// is needed) and W as the GEMM used it (only when dx is needed).
type Saved struct {
	X, W *tensor.Tensor
	// dy is BackwardInput's dy, copied into the layer's scratch for
	// BackwardWeight.
	dy *tensor.Tensor
}

// Forward computes this rank's share of y = x·Wᵀ + b. x is this rank's shard laid
// out as Config.X; y is laid out as Fwd.Final. The layer reuses y's storage in
// the next Forward: copy it to keep it longer (the same holds for Backward's dx).
func (l *Layer) Forward(ctx context.Context, rt Runtime, x *tensor.Tensor) (*tensor.Tensor, *Saved, error) {
	dt := l.Compute()
	if err := checkShape("x", x, l.X, l.rank, dt); err != nil {
		return nil, nil, err
	}
	w, b, err := l.computeParams(rt)
	if err != nil {
		return nil, nil, err
	}
	xu, err := l.move(ctx, rt, "x", x)
	if err != nil {
		return nil, nil, err
	}
	wu, err := l.move(ctx, rt, "w", w)
	if err != nil {
		return nil, nil, err
	}
	var bu *tensor.Tensor
	if b != nil {
		// The bias may need a private copy: an owner-rank partial zeroes it.
		if _, ok := l.fwdMoves["b"]; ok && b == l.B {
			if b, err = l.work.CopyOf("b-copy", b); err != nil {
				return nil, nil, err
			}
		}
		if bu, err = l.move(ctx, rt, "b", b); err != nil {
			return nil, nil, err
		}
	}
	y, err := l.bufs.Get(rt.Kernels, "y", dt, l.Fwd.Output.Spec.LocalShape(l.rank))
	if err != nil {
		return nil, nil, err
	}
	if err := rt.Op("linear_forward", func() error { return kernels.LinearForward(rt.Kernels, y, xu, wu, bu) }); err != nil {
		return nil, nil, fmt.Errorf("linear %s forward: %w", l.Name, err)
	}
	if y, err = l.move(ctx, rt, "y", y); err != nil {
		return nil, nil, err
	}
	s := &Saved{}
	if l.Grads.W {
		s.X = xu
	}
	if l.Grads.X {
		s.W = wu
	}
	return y, s, nil
}

// HoldCompute on makes the compute-dtype copies of W and B (a bfloat16
// layer's) cast at the next Forward and kept for the Forwards after it, until
// HoldCompute is called again: a pipeline step's micro-batches, between
// which the parameters do not change, share one cast. Off (the default),
// they are cast at every Forward, so that they follow the float32 masters
// whoever updates them. Either way the next Forward casts afresh.
func (l *Layer) HoldCompute(on bool) { l.hold, l.held = on, false }

// computeParams returns the parameters in the compute dtype: W and B
// themselves in float32, else copies cast from them (at every Forward, or
// once under HoldCompute).
func (l *Layer) computeParams(rt Runtime) (w, b *tensor.Tensor, err error) {
	dt := l.Compute()
	if dt == l.W.DType() {
		return l.W, l.B, nil
	}
	if l.hold && l.held {
		return l.wc, l.bc, nil
	}
	l.held = false
	if l.wc, err = l.work.Get(rt.Kernels, "w-compute", dt, l.W.Shape()); err != nil {
		return nil, nil, err
	}
	if err := rt.Kernels.Cast(l.wc, l.W); err != nil {
		return nil, nil, err
	}
	if l.B != nil {
		if l.bc, err = l.work.Get(rt.Kernels, "b-compute", dt, l.B.Shape()); err != nil {
			return nil, nil, err
		}
		if err := rt.Kernels.Cast(l.bc, l.B); err != nil {
			return nil, nil, err
		}
	}
	l.held = l.hold
	return l.wc, l.bc, nil
}

// move runs the forward plan's redistribution of one tensor (if any): the
// input's and the output's into the micro-batch's scratch, the parameters'
// (the same for every micro-batch of a step) into the workspace.
func (l *Layer) move(ctx context.Context, rt Runtime, name string, t *tensor.Tensor) (*tensor.Tensor, error) {
	m, ok := l.fwdMoves[name]
	if !ok {
		return t, nil
	}
	bufs := l.bufs
	if name == "w" || name == "b" {
		bufs = l.work
	}
	return Execute(ctx, rt, l.Name, name, m, t, l.rank, bufs, "forward")
}

// WorkBytes is the memory of the layer's workspace (SetScratch).
func (l *Layer) WorkBytes() int64 { return l.work.Bytes() }

// Backward computes the gradients the layer needs from dy (laid out as Bwd.DY)
// and returns dx (laid out as Config.X), or nil when dx is not needed. Weight
// and bias gradient terms accumulate across calls (micro-batches) until Reduce.
func (l *Layer) Backward(ctx context.Context, rt Runtime, dy *tensor.Tensor, s *Saved) (*tensor.Tensor, error) {
	return l.backward(ctx, rt, dy, s, backwardAll)
}

// BackwardInput is the first half of Backward: dx alone (nil when not
// needed). It keeps dy for BackwardWeight with the same Saved, which must
// follow before the scratch's next BackwardInput (a pipeline schedule
// defers the weight gradients into its bubbles, ZB-H1): dy itself when
// stable (the caller leaves it unchanged until then), else a copy in the
// layer's scratch.
func (l *Layer) BackwardInput(ctx context.Context, rt Runtime, dy *tensor.Tensor, s *Saved, stable bool) (*tensor.Tensor, error) {
	dx, err := l.backward(ctx, rt, dy, s, backwardInput)
	if err != nil || !(l.Grads.W || l.Grads.B) {
		return dx, err
	}
	if stable {
		s.dy = dy
		return dx, nil
	}
	s.dy, err = l.bufs.CopyOf("kept-dy", dy)
	return dx, err
}

// BackwardWeight is the second half of Backward: the weight and bias
// gradient terms (accumulating until Reduce) from the dy BackwardInput kept
// in s.
func (l *Layer) BackwardWeight(ctx context.Context, rt Runtime, s *Saved) error {
	if !(l.Grads.W || l.Grads.B) {
		return nil
	}
	if s == nil || s.dy == nil {
		return fmt.Errorf("%w: linear %s: weight gradients without BackwardInput's dy", ErrConfig, l.Name)
	}
	_, err := l.backward(ctx, rt, s.dy, s, backwardWeight)
	return err
}

// The halves of a backward: every gradient, dx alone, or dW and db alone.
const (
	backwardAll = iota
	backwardInput
	backwardWeight
)

func (l *Layer) backward(ctx context.Context, rt Runtime, dy *tensor.Tensor, s *Saved, half int) (*tensor.Tensor, error) {
	if err := checkShape("dy", dy, l.Bwd.DY.Spec, l.rank, l.Compute()); err != nil {
		return nil, err
	}
	// Layouts of dy this backward has made, shared by the gradients.
	dys := map[string]*tensor.Tensor{dyKey(l.Bwd.DY.Spec): dy}
	var dx *tensor.Tensor
	var err error
	for _, g := range l.Bwd.Grads {
		// A half skips the other's gradients, but the weight half still makes
		// the layouts of dy the input gradient's moves made (a later
		// gradient may move dy on from one of them).
		skip := half == backwardInput && g.Input != "x" || half == backwardWeight && g.Input == "x"
		if skip && half == backwardInput {
			continue
		}
		// The local operands: dy in the layout this gradient uses, then the saved
		// forward operand.
		ins := make([]*tensor.Tensor, len(g.Inputs))
		for i, in := range g.Inputs {
			local := g.Local[i].Spec
			if skip && in.Name != l.Bwd.DY.Name {
				continue
			}
			switch in.Name {
			case l.Bwd.DY.Name:
				t, ok := dys[dyKey(local)]
				if !ok {
					var err error
					if t, err = Execute(ctx, rt, l.Name, in.Name, moveOf(g.Plan, in.Name), dys[dyKey(in.Spec)], l.rank, l.work, "backward"); err != nil {
						return nil, err
					}
					dys[dyKey(local)] = t
				}
				ins[i] = t
			case "x", "w":
				t := s.X
				if in.Name == "w" {
					t = s.W
				}
				if t == nil {
					return nil, fmt.Errorf("%w: linear %s: backward needs the saved %s", ErrConfig, l.Name, in.Name)
				}
				if m := moveOf(g.Plan, in.Name); m.Steps != nil {
					c, err := l.work.CopyOf("saved-"+in.Name, t)
					if err != nil {
						return nil, err
					}
					if t, err = Execute(ctx, rt, l.Name, in.Name, m, c, l.rank, l.work, "backward"); err != nil {
						return nil, err
					}
				}
				ins[i] = t
			}
		}
		if skip {
			continue
		}
		switch g.Input {
		case "x":
			// A whole backward's dx is gone by the next micro-batch's; the
			// input half's may be kept to its weight half (a layer norm's
			// dy), in the micro-batch's scratch, unless SetPassDX.
			bufs := l.work
			if half == backwardInput && !l.passDX {
				bufs = l.bufs
			}
			d, err := bufs.Get(rt.Kernels, "dx", l.Compute(), g.Output.Spec.LocalShape(l.rank))
			if err != nil {
				return nil, err
			}
			if err := rt.Op("linear_backward_input", func() error { return kernels.LinearBackwardInput(rt.Kernels, d, ins[0], ins[1]) }); err != nil {
				return nil, fmt.Errorf("linear %s backward input: %w", l.Name, err)
			}
			if m := moveOf(g.Plan, g.Output.Name); m.Steps != nil {
				if d, err = Execute(ctx, rt, l.Name, g.Output.Name, m, d, l.rank, bufs, "backward"); err != nil {
					return nil, err
				}
			}
			dx = d
		case "w":
			if l.fusedLR != 0 {
				l.held = false // W changes here
				if err := rt.Op("linear_backward_weight_sgd", func() error { return l.sgdWeight(rt, ins[0], ins[1]) }); err != nil {
					return nil, fmt.Errorf("linear %s fused weight update: %w", l.Name, err)
				}
				continue
			}
			if l.dw == nil {
				if l.dw, err = rt.Kernels.Alloc(tensor.Float32, g.Output.Spec.LocalShape(l.rank)...); err != nil {
					return nil, err
				}
			}
			if err := rt.Op("linear_backward_weight", func() error {
				return kernels.LinearBackwardWeight(rt.Kernels, l.dw, ins[0], ins[1], l.pending)
			}); err != nil {
				return nil, fmt.Errorf("linear %s backward weight: %w", l.Name, err)
			}
		case "b":
			if l.db == nil {
				if l.db, err = rt.Kernels.Alloc(tensor.Float32, g.Output.Spec.LocalShape(l.rank)...); err != nil {
					return nil, err
				}
			}
			if err := rt.Op("linear_backward_bias", func() error { return kernels.LinearBackwardBias(rt.Kernels, l.db, ins[0], l.pending) }); err != nil {
				return nil, fmt.Errorf("linear %s backward bias: %w", l.Name, err)
			}
		}
	}
	if half != backwardInput {
		l.pending = l.pending || l.Grads.W || l.Grads.B
	}
	return dx, nil
}

// Reduce finishes the weight and bias gradients accumulated since the last
// Reduce: it runs their collectives once (not once per micro-batch) and returns
// them laid out as W and B (nil when not needed).
func (l *Layer) Reduce(ctx context.Context, rt Runtime) (dw, db *tensor.Tensor, err error) {
	if !l.pending {
		return nil, nil, nil
	}
	for _, g := range l.Bwd.Grads {
		var t *tensor.Tensor
		switch g.Input {
		case "w":
			t = l.dw
			if t == nil {
				continue // fused into Backward
			}
		case "b":
			t = l.db
		default:
			continue
		}
		if m := moveOf(g.Plan, g.Output.Name); m.Steps != nil {
			if t, err = l.reduceOne(ctx, rt, g.Output.Name, m, t); err != nil {
				return nil, nil, err
			}
		}
		if g.Input == "w" {
			dw = t
		} else {
			db = t
		}
	}
	l.pending = false
	return dw, db, nil
}

// reduceOne runs a float32 gradient's move in the wire dtype: cast down,
// moved, cast back up into a float32 buffer laid out as the result.
func (l *Layer) reduceOne(ctx context.Context, rt Runtime, name string, m spmd.Move, t *tensor.Tensor) (*tensor.Tensor, error) {
	wire := l.Wire()
	if wire == t.DType() {
		return Execute(ctx, rt, l.Name, name, m, t, l.rank, l.work, "reduce")
	}
	down, err := l.work.Get(rt.Kernels, "wire-"+name, wire, t.Shape())
	if err != nil {
		return nil, err
	}
	if err := rt.Kernels.Cast(down, t); err != nil {
		return nil, err
	}
	moved, err := Execute(ctx, rt, l.Name, name, m, down, l.rank, l.work, "reduce")
	if err != nil {
		return nil, err
	}
	up, err := l.work.Get(rt.Kernels, "reduced-"+name, t.DType(), moved.Shape())
	if err != nil {
		return nil, err
	}
	return up, rt.Kernels.Cast(up, moved)
}

// sgdWeight computes W += (-lr)·dyᵀ·x with one GEMM.
func (l *Layer) sgdWeight(rt Runtime, dy, x *tensor.Tensor) error {
	n, k := l.W.Dim(0), l.W.Dim(1)
	m := x.Len() / max(k, 1)
	if k == 0 {
		return nil
	}
	dy2, err := dy.Reshape(m, n)
	if err != nil {
		return err
	}
	x2, err := x.Reshape(m, k)
	if err != nil {
		return err
	}
	p := kernels.LinearBackwardWeightGemm(m, n, k, true, x.DType())
	p.OutDType = l.W.DType()
	p.Alpha = -float64(l.fusedLR)
	return rt.Kernels.Gemm(p, kernels.GemmOperands{A: dy2, B: x2, C: l.W})
}

// movesBytes reports whether a move sends anything between ranks (steps over
// groups of one rank only relabel the layout).
func movesBytes(m spmd.Move) bool {
	for _, st := range m.Steps {
		if st.Moves() {
			return true
		}
	}
	return false
}

func moveOf(p *spmd.Plan, name string) spmd.Move {
	for _, m := range p.Moves {
		if m.Tensor == name {
			return m
		}
	}
	return spmd.Move{}
}

func dyKey(s placement.Spec) string { return placement.FormatList(s.Placements) }

func checkShape(name string, t *tensor.Tensor, spec placement.Spec, rank int, dt tensor.DType) error {
	if t == nil {
		return fmt.Errorf("%w: %s is nil", ErrConfig, name)
	}
	if want := spec.LocalShape(rank); !slices.Equal(t.Shape(), want) {
		return fmt.Errorf("%w: rank %d's %s has shape %v, %s wants %v", ErrConfig, rank, name, t.Shape(), spec, want)
	}
	if t.DType() != dt {
		return fmt.Errorf("%w: %s is %v, want %v", ErrConfig, name, t.DType(), dt)
	}
	return nil
}
