package job

import (
	"context"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/tensor"
)

// gptRun is one rank's model as the training loop drives it: the whole
// model, or a pipeline stage (gpt_pp.go). Each takes a host batch, the
// same on every rank, and returns what is the same on every rank.
type gptRun interface {
	// step trains on the batch and returns the step's mean loss.
	step(ctx context.Context, b gptBatch) (float64, error)
	// loss is the batch's mean loss, without training.
	loss(ctx context.Context, b gptBatch) (float64, error)
	// next is the distribution of the token after position pos of the
	// first sequence of host (GPT.Next).
	next(ctx context.Context, host *tensor.Tensor, pos int, temp float64) ([]float64, error)
}

// model builds the rank's model (its stage's part under pp) and the run
// that drives it, on dev, with the linear runtime whose kernels and moves
// tr traces.
func (t *gptTask) model(ctx context.Context, w *collective.World, dev *kernels.Dispatcher, tr *tracer) (gptModel, gptRun, *linear.Runtime, error) {
	if t.pipe != nil {
		return t.pipe.model(ctx, t.cfg, w, dev, tr)
	}
	cfg := t.cfg
	var err error
	if cfg.CP() > 1 && t.rd.kind != tensor.CPU {
		// Ring attention runs on the host (the rank's q, k and v copied
		// there): on another device it takes the cpu kernels.
		if cfg.RingKernels, err = providers.New("cpu", nil); err != nil {
			return nil, nil, nil, err
		}
	}
	g, err := models.NewGPT(cfg, w.Rank(), dev)
	if err != nil {
		return nil, nil, nil, err
	}
	r := &wholeRun{g: g, rt: tr.runtime(w, dev)}
	return gptChunks{g}, r, &r.rt, nil
}

// gptModel is what the task asks of the rank's model: its parameters and
// the optimizer's state (to load and save), its step, and the last step's
// figures.
type gptModel interface {
	State() []linear.Param
	Params() []linear.Param
	SetStep(n int)
	AuxLoss() float64
	Balance() float64
	RingBytes() int64
	GradNorm() float64
	cpAttention() string
}

// gptChunks is the rank's model: the whole GPT, or a pipeline stage's
// parts (one, or its chunks under the interleaved schedule, each a GPT of
// its own blocks). The figures are the first part's (rank 0's under pp:
// stage 0's), the ring's bytes the parts' sum.
type gptChunks []*models.GPT

func (c gptChunks) State() []linear.Param {
	var out []linear.Param
	for _, g := range c {
		out = append(out, g.State()...)
	}
	return out
}

func (c gptChunks) Params() []linear.Param {
	var out []linear.Param
	for _, g := range c {
		out = append(out, g.Params()...)
	}
	return out
}

func (c gptChunks) SetStep(n int) {
	for _, g := range c {
		g.SetStep(n)
	}
}

func (c gptChunks) AuxLoss() float64    { return c[0].AuxLoss() }
func (c gptChunks) Balance() float64    { return c[0].Balance() }
func (c gptChunks) GradNorm() float64   { return c[0].GradNorm() }
func (c gptChunks) cpAttention() string { return c[0].CPAttention }

func (c gptChunks) RingBytes() int64 {
	var n int64
	for _, g := range c {
		n += g.RingBytes()
	}
	return n
}

// wholeRun is the whole model on the rank (tensor, data, context or expert
// parallel over the world).
type wholeRun struct {
	g  *models.GPT
	rt linear.Runtime
}

func (r *wholeRun) step(ctx context.Context, b gptBatch) (float64, error) {
	ids, tg, err := b.upload()
	if err != nil {
		return 0, err
	}
	return r.g.Step(ctx, r.rt, ids, tg)
}

func (r *wholeRun) loss(ctx context.Context, b gptBatch) (float64, error) {
	ids, tg, err := b.upload()
	if err != nil {
		return 0, err
	}
	return r.g.Loss(ctx, r.rt, ids, tg)
}

func (r *wholeRun) next(ctx context.Context, host *tensor.Tensor, pos int, temp float64) ([]float64, error) {
	ids, err := tensor.Upload(r.rt.Kernels, host)
	if err != nil {
		return nil, err
	}
	return r.g.Next(ctx, r.rt, ids, pos, temp)
}
