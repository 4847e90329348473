package models

import (
	"context"
	"fmt"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/moe"
	"github.com/meshrun/meshrun/pipeline/stage"
	"github.com/meshrun/meshrun/ring"
	"github.com/meshrun/meshrun/tensor"
)

// GPTStage runs a GPT's part (GPTConfig.Part) as one stage of a pipeline:
// Forward, BackwardInput and BackwardWeight per micro-batch, the methods
// package pipeline/stage's Run calls in the schedule's order. Each
// micro-batch in flight has a scratch of its own (the model's and each of
// its layers'), taken at its forward and given back after its weight
// gradients, so a micro-batch's saved activations survive the forwards and
// backwards of the others; the scratches made are the most micro-batches
// the stage held at once (Held). The gradients accumulate over a step's
// micro-batches (the layers' until Reduce, the model's own parameters'
// after the step's first backward), and Finish runs the optimizer once.
//
// Split (SetSplit, for ZB-H1), BackwardInput computes the input gradients
// alone and BackwardWeight the parameters' (the layers' from the dy each
// kept); otherwise BackwardInput computes both and BackwardWeight only gives
// the micro-batch's scratch back.
type GPTStage struct {
	g        *GPT
	rt       *linear.Runtime // read at each call: its Record may change between steps
	layers   []*linear.Layer
	home     stageSlot // the scratches the model had before the step
	free     []*stageSlot
	made     []*stageSlot // every scratch take made
	inflight map[int]*microBatch
	ids      []*tensor.Tensor
	targets  []*tensor.Tensor
	cur      *stageSlot // the slot in use
	loss     float64
	started  bool // a backward that writes the model's own gradients has run this step
	split    bool
	// next: Evaluate on the last stage computes Next's distribution at
	// next.pos into probs instead of the loss.
	next  *nextAt
	probs []float64
	// acc: the experts' parameters' gradients summed over the step's
	// micro-batches (a mixture-of-experts layer writes each backward's
	// afresh).
	acc  map[*param]*tensor.Tensor
	accN int // the backwards summed into acc this step
	// onDevice: the activations and gradients travel as device tensors in
	// the compute dtype (SetDeviceWire), not host float32.
	onDevice bool
}

// addExperts adds the experts' gradients of the backward that just ran to
// the step's sums.
func (s *GPTStage) addExperts() error {
	k := s.rt.Kernels
	for _, p := range s.g.params {
		if !p.expert {
			continue
		}
		a := s.acc[p]
		if a == nil {
			var err error
			if a, err = k.Alloc(tensor.Float32, p.g.Shape()...); err != nil {
				return err
			}
			if s.acc == nil {
				s.acc = map[*param]*tensor.Tensor{}
			}
			s.acc[p] = a
		}
		if s.accN == 0 {
			if n := a.Bytes(); n > 0 {
				if err := k.Copy2D(a, 0, n, p.g, 0, n, n, 1); err != nil {
					return err
				}
			}
		} else if err := k.Axpy(1, p.g, a); err != nil {
			return err
		}
	}
	s.accN++
	return nil
}

// nextAt is a sampling Evaluate's position and temperature.
type nextAt struct {
	pos  int
	temp float64
}

// SetDeviceWire makes the stage send and receive its activations and
// gradients as tensors of its device in the compute dtype (stage.Wire with
// the device's memory: NCCL between GPUs), not as host float32 copies. On
// the cpu device it changes nothing.
func (s *GPTStage) SetDeviceWire(on bool) { s.onDevice = on }

// Wire is the stage's wire (stage.Wired): host float32, or its device's
// memory in the compute dtype after SetDeviceWire(true) on a device.
func (s *GPTStage) Wire() stage.Wire {
	if !s.deviceWire() {
		return stage.Wire{}
	}
	return stage.Wire{Mem: s.mem(), DType: s.g.Cfg.Compute()}
}

func (s *GPTStage) deviceWire() bool {
	return s.onDevice && s.rt.Kernels.Device().Kind != tensor.CPU
}

// mem is the stage's device memory as its provider made it (the cuda or
// sim Memory, which a collective library's communicator needs).
func (s *GPTStage) mem() tensor.Memory { return kernels.DeviceMemory(s.rt.Kernels) }

// SetSplit splits each micro-batch's backward: the input gradients in
// BackwardInput, the parameters' in BackwardWeight (ZB-H1's B and W).
func (s *GPTStage) SetSplit(split bool) { s.split = split }

// stageSlot is one micro-batch's scratch: the model's and its layers', and
// what a block keeps of its forward for its backward besides: under cp its
// ring attention (the keys and values), with experts its layer's state (the
// routing).
type stageSlot struct {
	model  linear.Scratch
	layers []linear.Scratch
	rings  []*ring.Attention
	moes   []*moe.State
}

// microBatch is a micro-batch in flight: its scratch, the rank's ids and
// targets of it, and what its forward kept for its backward.
type microBatch struct {
	slot     *stageSlot
	ids, tgs *tensor.Tensor
	acts     *gptActs
}

// Stage returns the model's part as a pipeline stage computing on *rt (as
// it is at each call).
func (g *GPT) Stage(rt *linear.Runtime) *GPTStage {
	s := &GPTStage{g: g, rt: rt, inflight: map[int]*microBatch{}}
	for _, b := range g.blocks {
		for _, l := range []*linear.Layer{b.qkv, b.proj, b.up, b.down} { // up and down nil with experts
			if l != nil {
				s.layers = append(s.layers, l)
			}
		}
	}
	if g.head != nil {
		s.layers = append(s.layers, g.head)
	}
	return s
}

// Begin starts a step of len(targets) micro-batches: ids[mb] and
// targets[mb] are micro-batch mb's token ids and targets (each Batch ×
// Context, float32, on the rank's device; the first stage reads the ids,
// the last the targets).
func (s *GPTStage) Begin(ids, targets []*tensor.Tensor) error {
	if len(ids) != len(targets) || len(ids) == 0 {
		return fmt.Errorf("%w: gpt stage: %d micro-batches of ids, %d of targets", linear.ErrConfig, len(ids), len(targets))
	}
	if len(s.inflight) > 0 {
		return fmt.Errorf("%w: gpt stage: a step begun with %d micro-batches of the last still in flight", linear.ErrConfig, len(s.inflight))
	}
	s.ids, s.targets, s.loss, s.started, s.accN = ids, targets, 0, false, 0
	s.home, s.cur = stageSlot{model: s.g.bufs}, nil
	for _, l := range s.layers {
		s.home.layers = append(s.home.layers, l.SetScratch(nil))
		l.HoldCompute(true) // the step's micro-batches share one cast of the parameters
	}
	s.use(&s.home)
	return nil
}

// SetBatch sets the micro-batches Evaluate reads (as Begin's), its loss
// to 0, and with next its sampling position and temperature (Next's: the
// last stage's Evaluate computes the distribution at pos of the first
// sequence, Probs); without, the loss (Loss).
func (s *GPTStage) SetBatch(ids, targets []*tensor.Tensor, next bool, pos int, temp float64) error {
	if len(ids) != len(targets) || len(ids) == 0 {
		return fmt.Errorf("%w: gpt stage: %d micro-batches of ids, %d of targets", linear.ErrConfig, len(ids), len(targets))
	}
	s.ids, s.targets, s.loss, s.next, s.probs = ids, targets, 0, nil, nil
	if next {
		s.next = &nextAt{pos, temp}
	}
	return nil
}

// Evaluate runs micro-batch mb's forward alone (a held-out loss,
// sampling), in a scratch given back at once: from its ids on the first
// stage, else from in; it returns the residual stream for the next stage,
// and on the last stage adds the micro-batch's loss (or computes the
// distribution, SetBatch).
func (s *GPTStage) Evaluate(ctx context.Context, mb int, in *tensor.Tensor) (*tensor.Tensor, error) {
	if mb < 0 || mb >= len(s.targets) {
		return nil, fmt.Errorf("%w: gpt stage: evaluating micro-batch %d of %d", linear.ErrConfig, mb, len(s.targets))
	}
	if s.home.layers == nil {
		s.home, s.cur = stageSlot{model: s.g.bufs}, nil
		for _, l := range s.layers {
			s.home.layers = append(s.home.layers, l.SetScratch(nil))
		}
	}
	sl := s.take()
	s.use(sl)
	defer func() {
		s.keep()
		s.free = append(s.free, sl)
		s.use(&s.home)
	}()
	in, err := s.arrived("pp.in", in)
	if err != nil {
		return nil, err
	}
	if s.next != nil {
		out, p, err := s.g.next(ctx, *s.rt, s.ids[mb], in, s.next.pos, s.next.temp)
		s.probs = p
		if err != nil {
			return nil, err
		}
		return s.sent(out)
	}
	ids, tgs, err := s.g.local(*s.rt, s.ids[mb], s.targets[mb])
	if err != nil {
		return nil, err
	}
	loss, out, _, err := s.g.forwardPart(ctx, *s.rt, ids, tgs, in)
	if err != nil {
		return nil, err
	}
	s.loss += loss
	return s.sent(out)
}

// Shape is the shape of the residual stream the stage sends and receives
// for a micro-batch: the rank's rows of it (under dp or cp its tokens,
// under sequence parallelism its share of them) × the model's width.
func (s *GPTStage) Shape() []int { return []int{s.g.streamRows, s.g.Cfg.Dim} }

// Probs is the last sampling Evaluate's distribution on the last stage
// (nil elsewhere).
func (s *GPTStage) Probs() []float64 { return s.probs }

// use points the model and its layers at sl's scratch, and its blocks at
// sl's ring attentions and experts' states, those of the slot in use before
// kept in it.
func (s *GPTStage) use(sl *stageSlot) {
	if sl == s.cur {
		return
	}
	n := len(s.g.blocks)
	if sl.rings == nil {
		sl.rings, sl.moes = make([]*ring.Attention, n), make([]*moe.State, n)
	}
	s.g.bufs = sl.model
	for i, l := range s.layers {
		l.SetScratch(sl.layers[i])
	}
	for i, b := range s.g.blocks {
		if s.cur != nil {
			s.cur.rings[i] = b.ring
		}
		b.ring = sl.rings[i]
		if b.moe != nil {
			old := b.moe.SwapState(sl.moes[i])
			if s.cur != nil {
				s.cur.moes[i] = old
			}
		}
	}
	s.cur = sl
}

// keep stores in the slot in use what its blocks made (its ring
// attentions).
func (s *GPTStage) keep() {
	for i, b := range s.g.blocks {
		s.cur.rings[i] = b.ring
	}
}

// take returns a free scratch, or a new one.
func (s *GPTStage) take() *stageSlot {
	if n := len(s.free); n > 0 {
		sl := s.free[n-1]
		s.free = s.free[:n-1]
		return sl
	}
	sl := &stageSlot{model: linear.Scratch{}}
	for range s.layers {
		sl.layers = append(sl.layers, linear.Scratch{})
	}
	s.made = append(s.made, sl)
	return sl
}

// sent is t as a neighbour gets it (nil stays nil; what Run sends must not
// change afterwards, and t is scratch): on a device wire a copy on the
// device; else a host float32 copy: a device tensor downloaded, a bfloat16
// one widened (exactly).
func (s *GPTStage) sent(t *tensor.Tensor) (*tensor.Tensor, error) {
	if t == nil {
		return nil, nil
	}
	if s.deviceWire() {
		m := s.mem()
		c, err := m.Alloc(t.DType(), t.Shape()...)
		if err != nil {
			return nil, err
		}
		if n := t.Bytes(); n > 0 {
			if err := m.Copy2D(c, 0, n, t, 0, n, n, 1); err != nil {
				m.Free(c)
				return nil, err
			}
		}
		return c, nil
	}
	if t.OnHost() && t.DType() == tensor.Float32 {
		return t.Clone()
	}
	h, err := tensor.Download(t)
	if err != nil {
		return nil, err
	}
	return tensor.Convert(h, tensor.Float32)
}

// arrived is t, what a neighbour sent (on the stage's wire), as the model
// computes on it: itself (host float32 on the cpu device), or copied into
// scratch name, in the compute dtype on the device (Run gives t back once
// the action has run).
func (s *GPTStage) arrived(name string, t *tensor.Tensor) (*tensor.Tensor, error) {
	dt := s.g.Cfg.Compute()
	if t == nil || dt == tensor.Float32 && s.rt.Kernels.Device().Kind == tensor.CPU {
		return t, nil
	}
	d, err := s.g.bufs.Get(s.rt.Kernels, name, dt, t.Shape())
	if err != nil {
		return nil, err
	}
	n := d.Bytes()
	if n == 0 {
		return d, nil
	}
	if !t.OnHost() {
		return d, s.mem().Copy2D(d, 0, n, t, 0, n, n, 1)
	}
	c, err := tensor.Convert(t, dt)
	if err != nil {
		return nil, err
	}
	return d, s.rt.Kernels.Write(d, 0, tensor.HostBytes(c), tensor.Transfer)
}

// Forward runs micro-batch mb's forward: from its ids on the first stage,
// else from in; it returns the residual stream for the next stage (nil on
// the last, which adds the micro-batch's loss to the step's).
func (s *GPTStage) Forward(ctx context.Context, mb int, in *tensor.Tensor) (*tensor.Tensor, error) {
	if mb < 0 || mb >= len(s.targets) || s.inflight[mb] != nil {
		return nil, fmt.Errorf("%w: gpt stage: forward of micro-batch %d (of %d; in flight: %v)", linear.ErrConfig, mb, len(s.targets), s.inflight[mb] != nil)
	}
	sl := s.take()
	s.use(sl)
	ids, tgs, err := s.g.local(*s.rt, s.ids[mb], s.targets[mb])
	if err != nil {
		return nil, err
	}
	if in, err = s.arrived("pp.in", in); err != nil {
		return nil, err
	}
	loss, out, acts, err := s.g.forwardPart(ctx, *s.rt, ids, tgs, in)
	s.keep()
	if err != nil {
		return nil, err
	}
	s.inflight[mb] = &microBatch{slot: sl, ids: ids, tgs: tgs, acts: acts}
	s.loss += loss
	return s.sent(out)
}

// BackwardInput runs micro-batch mb's backward, from its loss on the last
// stage, else from dout; it returns the gradient of the stage's input for
// the previous stage (nil on the first).
func (s *GPTStage) BackwardInput(ctx context.Context, mb int, dout *tensor.Tensor) (*tensor.Tensor, error) {
	m := s.inflight[mb]
	if m == nil {
		return nil, fmt.Errorf("%w: gpt stage: backward of micro-batch %d before its forward", linear.ErrConfig, mb)
	}
	s.use(m.slot)
	dout, err := s.arrived("pp.dout", dout)
	if err != nil {
		return nil, err
	}
	s.g.accum, s.g.splitB = s.started, s.split
	din, err := s.g.backwardPart(ctx, *s.rt, m.ids, m.tgs, m.acts, dout)
	s.g.splitB = false
	if err != nil {
		return nil, err
	}
	if err := s.addExperts(); err != nil {
		return nil, err
	}
	if !s.split {
		s.started = true
	}
	return s.sent(din)
}

// BackwardWeight ends micro-batch mb: split, it computes its parameters'
// gradients; its scratch is given back.
func (s *GPTStage) BackwardWeight(ctx context.Context, mb int) error {
	m := s.inflight[mb]
	if m == nil {
		return fmt.Errorf("%w: gpt stage: weight gradients of micro-batch %d before its forward", linear.ErrConfig, mb)
	}
	if s.split {
		s.use(m.slot)
		s.g.accum = s.started
		if err := s.g.weightPart(ctx, *s.rt, m.ids, m.acts); err != nil {
			return err
		}
		s.started = true
	}
	delete(s.inflight, mb)
	s.free = append(s.free, m.slot)
	return nil
}

// Loss is the sum of the step's micro-batches' losses on the last stage
// (the step's mean loss), 0 elsewhere.
func (s *GPTStage) Loss() float64 { return s.loss }

// WorkBytes is the memory of the workspace the stage's micro-batches share
// (the model's and its layers'): what no micro-batch keeps past its own
// pass, such as a whole backward's gradients and the parameters in the
// compute dtype.
func (s *GPTStage) WorkBytes() int64 {
	n := s.g.work.Bytes()
	for _, l := range s.layers {
		n += l.WorkBytes()
	}
	return n
}

// Held is the most micro-batches the stage has held at once (the scratches
// it made).
func (s *GPTStage) Held() int { return len(s.made) }

// ScratchBytes is the memory of the scratches the stage made (Held of
// them): what each micro-batch keeps from its forward to its backward (the
// model's and its layers' saved activations, under cp its ring
// attentions', with experts their states'; split, the gradients its B
// keeps for its W), as allocated on the stage's device. Call it between
// steps.
func (s *GPTStage) ScratchBytes() int64 {
	var n int64
	for _, sl := range s.made {
		n += sl.model.Bytes()
		for _, l := range sl.layers {
			n += l.Bytes()
		}
		for _, r := range sl.rings {
			if r != nil {
				n += r.Bytes()
			}
		}
		for _, m := range sl.moes {
			n += m.Bytes()
		}
	}
	return n
}

// Reduce ends the step's passes: the model gets its own scratch back and
// its gradients, the micro-batches' sums, are reduced (their collectives
// once). With ClipGrad it returns this rank's GradSquares, which the
// pipeline sums over its ranks and stages for Finish.
func (s *GPTStage) Reduce(ctx context.Context) (float64, error) {
	if len(s.inflight) > 0 {
		return 0, fmt.Errorf("%w: gpt stage: step finished with %d micro-batches in flight", linear.ErrConfig, len(s.inflight))
	}
	s.use(&s.home)
	s.g.accum = false
	for _, l := range s.layers {
		l.HoldCompute(false) // the optimizer changes the parameters
	}
	for p, a := range s.acc { // the step's sums, for the optimizer
		if n := a.Bytes(); n > 0 {
			if err := s.rt.Kernels.Copy2D(p.g, 0, n, a, 0, n, n, 1); err != nil {
				return 0, err
			}
		}
	}
	s.accN = 0
	if err := s.g.Gradients(ctx, *s.rt); err != nil {
		return 0, err
	}
	return s.g.GradSquares(*s.rt)
}

// Finish runs the optimizer on the reduced gradients (Reduce): sq is the
// sum of the gradients' squares over the whole model, for ClipGrad.
func (s *GPTStage) Finish(ctx context.Context, sq float64) error {
	return s.g.Apply(ctx, *s.rt, sq)
}

// GradNorm is the last step's global gradient norm (ClipGrad).
func (s *GPTStage) GradNorm() float64 { return s.g.GradNorm() }
