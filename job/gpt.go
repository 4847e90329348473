package job

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// DefaultCorpus is the text `worker gpt` trains on without --data: the
// licences Debian's base-files package installs on every system (the GPL,
// LGPL, GFDL, Apache, MPL, Artistic, BSD and CC0 texts, about 250 KB of
// English), so no download and no install is needed.
const DefaultCorpus = "/usr/share/common-licenses"

// GPTReport is the JSON line `worker gpt` prints on rank 0 at the end.
type GPTReport struct {
	Mesh             string `json:"mesh"`
	Data             string `json:"data"`
	DataBytes        int    `json:"data_bytes"`
	Vocab            int    `json:"vocab"`
	Layers           int    `json:"layers"`
	Heads            int    `json:"heads"`
	Dim              int    `json:"dim"`
	Context          int    `json:"context"`
	Batch            int    `json:"batch"`
	DType            string `json:"dtype"`
	Optimizer        string `json:"optimizer"`
	SequenceParallel bool   `json:"sequence_parallel"`
	Steps            int    `json:"steps"`
	FirstStep        int    `json:"first_step"` // 1, or the checkpoint's step + 1
	// Losses in nats per character; the unigram entropy of the training text
	// is what a model that ignores context reaches.
	LossFirst   float64 `json:"loss_first"`
	LossLast    float64 `json:"loss_last"`
	HeldOutLoss float64 `json:"heldout_loss"`
	// HeldOutCurve: with --eval-every, the held-out loss every so many
	// steps (the last at the final step equals HeldOutLoss).
	HeldOutCurve   []HeldOutPoint `json:"heldout_curve,omitempty"`
	UnigramEntropy float64        `json:"unigram_entropy"`
	StepMSMedian   float64        `json:"step_ms_median"`
	// TokensPerS and TFLOPS are the job's throughput at the median step:
	// the step's tokens, and the model's FLOPs in Megatron's count
	// (models.GPTConfig.FlopsPerStep) in TFLOP/s, the whole job's
	// (TFLOPSPerRank: divided by the ranks).
	TokensPerS       float64        `json:"tokens_per_s"`
	TFLOPS           float64        `json:"model_tflops"`
	TFLOPSPerRank    float64        `json:"model_tflops_per_rank"`
	CommBytesPerStep int64          `json:"comm_bytes_per_step"`
	Collectives      map[string]int `json:"collectives_per_step"`
	Sample           string         `json:"sample"`
	// SaveFailures counts the saves that failed and were skipped
	// (--save-errors continue).
	SaveFailures int `json:"save_failures,omitempty"`
	// With --experts: the mixture of experts, and the last training step's
	// load-balancing loss as the objective adds it (aux_coef × the sum over
	// the blocks of each layer's aux) and the mean aux per layer (1:
	// balanced); the losses above stay the cross-entropy.
	Experts        int     `json:"experts,omitempty"`
	TopK           int     `json:"top_k,omitempty"`
	AuxCoef        float64 `json:"aux_coef,omitempty"`
	CapacityFactor float64 `json:"capacity_factor,omitempty"`
	AuxLossLast    float64 `json:"aux_loss_last,omitempty"`
	BalanceLast    float64 `json:"aux_balance_last,omitempty"`
	// RingBytesPerStep: with cp, the bytes rank 0 sent around the cp ring
	// in the last training step's ring attention (keys, values and their
	// gradients, point to point: not among the collectives above).
	RingBytesPerStep int64 `json:"ring_bytes_per_step,omitempty"`
	// CPAttention is how attention ran over cp, as the planner chose it:
	// "ring", or "gather" (keys and values all-gathered; short contexts).
	CPAttention string `json:"cp_attention,omitempty"`
	// Pipeline: with pp, the stages and what the last step measured.
	Pipeline *PipelineReport `json:"pipeline,omitempty"`
	// With --clip-grad: the clipping norm and the last step's global
	// gradient norm before clipping; with --warmup or a decay, the last
	// step's learning rate.
	ClipGrad     float64 `json:"clip_grad,omitempty"`
	GradNormLast float64 `json:"grad_norm_last,omitempty"`
	LRLast       float64 `json:"lr_last,omitempty"`
}

// HeldOutPoint is the held-out loss after a step.
type HeldOutPoint struct {
	Step int     `json:"step"`
	Loss float64 `json:"loss"`
}

// gptTask is `worker gpt`.
type gptTask struct {
	training
	cfg       models.GPTConfig
	data      string
	sample    int
	temp      float64
	corpus    *corpus
	heldOut   int          // batches of held-out text the final loss averages
	evalEvery int          // --eval-every: the held-out loss every so many steps (0: at the end)
	pipe      *gptPipeline // with a mesh dim pp (gpt_pp.go)
	pf        pipeFlags
}

func (t *gptTask) flags(fs *flag.FlagSet) {
	t.register(fs, "device `MESH`: tp=N, tensor parallel (default tp=$WORLD_SIZE); dp=D,cp=C,tp=N or any of its dims in that order (dp=D,tp=N, cp=C,tp=N, dp=D,cp=C, dp=D, cp=C): dp splits the batch (data parallel; --batch a multiple of dp), cp each sequence in the zigzag layout (ring attention; --context a multiple of 2·cp); with --experts also ep=E,tp=N, the experts split over ep and the batch too (data parallel); pp=P or pp=P,tp=N splits the blocks into P pipeline stages (--micro-batches, --schedule, --pp-layers)")
	fs.BoolVar(&t.cfg.SequenceParallel, "sequence-parallel", false, "split tokens over tp outside the linear layers (Megatron's sequence parallelism)")
	fs.IntVar(&t.cfg.Layers, "layers", 2, "transformer blocks")
	fs.IntVar(&t.cfg.Heads, "heads", 4, "attention heads (a multiple of tp)")
	fs.IntVar(&t.cfg.Dim, "dim", 128, "model width")
	fs.IntVar(&t.cfg.Context, "context", 64, "characters per sequence")
	fs.IntVar(&t.cfg.Batch, "batch", 16, "sequences per step")
	fs.IntVar(&t.steps, "steps", 200, "training steps")
	fs.StringVar(&t.cfg.Optimizer, "optimizer", "adamw", "`OPT`: adamw or sgd")
	fs.Float64Var(&t.cfg.LR, "lr", 3e-3, "learning rate")
	fs.Float64Var(&t.cfg.WeightDecay, "weight-decay", 0.1, "AdamW's weight decay on matrices and embeddings")
	fs.Float64Var(&t.cfg.ClipGrad, "clip-grad", 0, "scale each step's gradients to a global L2 norm of at most `NORM` (over the whole model, every rank and stage: torch's clip_grad_norm_, Megatron's --clip-grad; 0: off)")
	fs.IntVar(&t.cfg.Warmup, "warmup", 0, "raise the learning rate linearly from 0 over the first `N` steps")
	fs.StringVar(&t.cfg.Decay, "lr-decay", "constant", "the learning rate after the warmup, `STYLE`: constant, or cosine (down to --min-lr at the last step)")
	fs.Float64Var(&t.cfg.MinLR, "min-lr", 0, "with --lr-decay cosine: the learning rate it ends at")
	fs.Uint64Var(&t.cfg.Seed, "seed", 1, "seed of the parameters and of the batches")
	fs.IntVar(&t.cfg.Experts, "experts", 0, "replace each block's MLP with a mixture of `E` experts (0: the dense MLP; float32 only)")
	fs.IntVar(&t.cfg.TopK, "top-k", 2, "experts per token, 1 to --experts (with --experts)")
	fs.Float64Var(&t.cfg.AuxCoef, "aux-coef", 0.01, "weight of the experts' load-balancing loss in the objective (with --experts)")
	fs.Float64Var(&t.cfg.CapacityFactor, "capacity-factor", 0, "each expert keeps at most ceil(tokens·top-k·`C`/experts) slots (0: dropless; with --experts)")
	fs.StringVar(&t.data, "data", DefaultCorpus, "text `PATH` (a file, or a directory whose files are read in name order), read as characters (bytes)")
	fs.IntVar(&t.sample, "sample", 200, "characters to sample at the end")
	fs.IntVar(&t.evalEvery, "eval-every", 0, "print the held-out loss every `N` steps (the final one's batches; 0: at the end only)")
	fs.Float64Var(&t.temp, "temperature", 0.8, "sampling temperature")
	t.pf.register(fs)
}

func (t *gptTask) setup(ctx context.Context, env Env, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	if err := t.prepare(env); err != nil {
		return err
	}
	if t.steps < 1 || t.sample < 0 || !(t.temp > 0) || !(t.cfg.LR > 0) || t.cfg.WeightDecay < 0 || t.evalEvery < 0 {
		return fmt.Errorf("--steps and --lr must be positive, --sample, --weight-decay and --eval-every not negative, --temperature positive")
	}
	t.cfg.DType = t.rd.dtype
	t.cfg.DecaySteps = t.steps // a cosine ends at the last step (a resumed run's too)
	var err error
	if t.corpus, err = readCorpus(t.data, t.cfg.Context+1); err != nil {
		return err
	}
	t.cfg.Mesh, t.cfg.Vocab = t.m, len(t.corpus.chars)
	if t.pipe, err = pipelineOf(t.m, t.cfg, t.pf); err != nil {
		return err
	}
	if t.pipe != nil {
		t.cfg.Mesh = t.pipe.stage // each stage's; checked whole below
	}
	// One planner for the ranks of this process: each plans a layer once.
	t.cfg.Planner = placement.DefaultPlanner()
	t.heldOut = 8
	// Checked as the ranks will build it: a bad layout, or a checkpoint
	// that does not fit the model, fails here, before any rank starts.
	// --resume (or a restart's) restores the optimizer's state too; --init
	// takes weights only.
	ps, err := models.PlanGPT(t.cfg, t.cf.init == "")
	if err != nil {
		return err
	}
	return t.resume(env, ps)
}

// corpus is a text read as bytes: its characters (the vocabulary, sorted),
// the training text and the held-out tenth, as ids.
type corpus struct {
	path         string
	chars        []byte
	id           [256]int
	train, valid []int
}

func readCorpus(path string, window int) (*corpus, error) {
	var text []byte
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--data: %w", err)
	}
	if st.IsDir() {
		err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.Type().IsRegular() { // symlinks (GPL -> GPL-3) would repeat texts
				return nil
			}
			b, err := os.ReadFile(p)
			text = append(text, b...)
			return err
		})
	} else {
		text, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("--data: %w", err)
	}
	c := &corpus{path: path}
	seen := [256]bool{}
	for _, b := range text {
		seen[b] = true
	}
	for b := range seen {
		if seen[b] {
			c.id[b] = len(c.chars)
			c.chars = append(c.chars, byte(b))
		}
	}
	ids := make([]int, len(text))
	for i, b := range text {
		ids[i] = c.id[b]
	}
	cut := len(ids) * 9 / 10
	c.train, c.valid = ids[:cut], ids[cut:]
	if len(c.train) <= window || len(c.valid) <= window || len(c.chars) < 2 {
		return nil, fmt.Errorf("--data %s: %d bytes, %d characters: too little text for a context of %d", path, len(text), len(c.chars), window-1)
	}
	return c, nil
}

// entropy is the unigram entropy of the training text, in nats.
func (c *corpus) entropy() float64 {
	counts := make([]float64, len(c.chars))
	for _, id := range c.train {
		counts[id]++
	}
	var h float64
	for _, n := range counts {
		if n > 0 {
			p := n / float64(len(c.train))
			h -= p * math.Log(p)
		}
	}
	return h
}

// batch fills ids and targets with batch windows of text drawn by rng.
func (c *corpus) batch(rng *rand.Rand, text []int, batch, context int, ids, targets []float32) {
	for b := 0; b < batch; b++ {
		start := rng.IntN(len(text) - context)
		for i := 0; i < context; i++ {
			ids[b*context+i] = float32(text[start+i])
			targets[b*context+i] = float32(text[start+i+1])
		}
	}
}

func (t *gptTask) run(ctx context.Context, env Env) int {
	if t.profile != "" {
		stop, err := startProfile(env, t.profile)
		if err != nil {
			return usageError(env, "gpt", err)
		}
		defer stop()
	}
	var report *GPTReport
	var mu sync.Mutex
	err := ranks(ctx, env, t.m.Size(), func(ctx context.Context, w *collective.World) error {
		r, err := t.rank(ctx, env, w)
		if err != nil || r == nil {
			return err
		}
		mu.Lock()
		report = r
		mu.Unlock()
		return nil
	})
	return finish(env, "gpt", err, report)
}

// rank is one rank's run: it builds its share of the model (from the
// checkpoint when resuming), trains it, measures the held-out loss and
// samples text; rank 0 prints the result and returns the report, the other
// ranks nil.
func (t *gptTask) rank(ctx context.Context, env Env, w *collective.World) (*GPTReport, error) {
	cfg, c := t.cfg, t.corpus
	dev, err := t.rd.build()
	if err != nil {
		return nil, err
	}
	tr := newTracer(env.Run)
	comms := &stepComms{counts: map[string]int{}}
	g, run, rt, err := t.model(ctx, w, dev, tr)
	if err != nil {
		return nil, err
	}
	if t.ck != nil {
		if err := t.loadCheckpoint(ctx, env, w, rt.World, g); err != nil {
			return nil, err
		}
	}
	sv := &saves{cf: t.cf, env: env, workload: "gpt"}
	if t.pipe != nil { // each stage saves its parameters, laid out over its ranks
		sv.view, sv.mesh = rt.World, t.m.String()
	}
	rt.Record = comms.record
	b := gptBatch{dev: dev, ids: tensor.New(tensor.Float32, cfg.Tokens()), targets: tensor.New(tensor.Float32, cfg.Tokens())}
	// Every rank draws the same batches from the same seed.
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x64617461))
	tl, err := t.train(ctx, env, w, g, run, tr, b, rng, sv, comms)
	if err != nil {
		return nil, err
	}
	rt.Record = nil // the last step's counts stay
	held, err := t.heldOutLoss(ctx, run, b)
	if err != nil {
		return nil, err
	}
	text, err := t.generate(ctx, run, rng)
	if err != nil {
		return nil, err
	}
	var pipe *PipelineReport
	if pr, ok := run.(*ppRun); ok {
		if pipe, err = pr.report(ctx); err != nil {
			return nil, err
		}
	}
	if w.Rank() != 0 {
		return nil, nil
	}
	fmt.Fprintf(env.Stdout, "held-out loss %.4f nats/char; unigram entropy of the text %.4f\n", held, c.entropy())
	stepMS := median(tl.stepMS)
	tokS, tflops := float64(cfg.Tokens())/stepMS*1e3, cfg.FlopsPerStep()/stepMS/1e9 // the whole model's (a stage's part has its own)
	fmt.Fprintf(env.Stdout, "throughput: %.0f tokens/s, %.4g model TFLOP/s (%.4g a rank; Megatron's count) at the median step, %.1f ms\n",
		tokS, tflops, tflops/float64(w.Size()), stepMS)
	if pipe != nil {
		fmt.Fprint(env.Stdout, pipe.Text())
	}
	fmt.Fprintf(env.Stdout, "sample:\n%s\n", text)
	return &GPTReport{Mesh: t.m.String(), Data: c.path, DataBytes: len(c.train) + len(c.valid), Vocab: cfg.Vocab, Layers: cfg.Layers,
		Heads: cfg.Heads, Dim: cfg.Dim, Context: cfg.Context, Batch: cfg.Batch, DType: cfg.Compute().String(), Optimizer: cfg.Optimizer, SequenceParallel: cfg.SequenceParallel, Steps: t.steps, FirstStep: t.startStep + 1,
		LossFirst: tl.first, LossLast: tl.last, HeldOutLoss: held, HeldOutCurve: tl.curve, UnigramEntropy: c.entropy(), StepMSMedian: stepMS,
		TokensPerS: tokS, TFLOPS: tflops, TFLOPSPerRank: tflops / float64(w.Size()),
		CommBytesPerStep: comms.bytes, Collectives: maps.Clone(comms.counts), Sample: text, SaveFailures: sv.Failed,
		Experts: cfg.Experts, TopK: experts(cfg, cfg.TopK), AuxCoef: experts(cfg, cfg.AuxCoef), CapacityFactor: experts(cfg, cfg.CapacityFactor),
		AuxLossLast: tl.aux, BalanceLast: tl.balance, RingBytesPerStep: tl.ringBytes, CPAttention: tl.cpAttention, Pipeline: pipe,
		ClipGrad: cfg.ClipGrad, GradNormLast: tl.gradNorm, LRLast: schedLR(cfg, tl.lr)}, nil
}

// loadCheckpoint loads the checkpoint into g (its parameters alone with
// --init, else its whole state) and sets its step, on every rank once all
// are ready.
func (t *gptTask) loadCheckpoint(ctx context.Context, env Env, w, view *collective.World, g gptModel) error {
	if err := waitAll(ctx, w); err != nil {
		return err
	}
	if t.autoResumed && w.Rank() == 0 {
		fmt.Fprintf(env.Stderr, "gpt: restart %s: resuming from %s at step %d\n", env.Getenv(EnvRestartCount), t.ck.Dir, t.startStep)
	}
	ps := g.State()
	if t.cf.init != "" {
		ps = g.Params()
	}
	// view: the ranks the parameters' layouts are over (a pipeline
	// stage's; the world's without pp).
	if err := linear.LoadParams(ctx, view, t.ck, ps); err != nil {
		return err
	}
	g.SetStep(t.startStep)
	return nil
}

// gptBatch is one batch of token ids and their targets on the host, filled
// by corpus.batch and uploaded to the rank's device for each step.
type gptBatch struct {
	dev          tensor.Memory
	ids, targets *tensor.Tensor
}

// upload copies the batch to the device.
func (b gptBatch) upload() (*tensor.Tensor, *tensor.Tensor, error) {
	ids, err := tensor.Upload(b.dev, b.ids)
	if err != nil {
		return nil, nil, err
	}
	tg, err := tensor.Upload(b.dev, b.targets)
	return ids, tg, err
}

// trainLosses are what the training loop reports: the first and last
// step's losses and every step's time.
type trainLosses struct {
	first, last float64
	stepMS      []float64
	// aux and balance: the last step's (GPT.AuxLoss, GPT.Balance).
	aux, balance float64
	ringBytes    int64          // the last step's GPT.RingBytes
	cpAttention  string         // GPT.CPAttention
	gradNorm, lr float64        // the last step's (GPT.GradNorm, GPTConfig.LRAt)
	curve        []HeldOutPoint // --eval-every's
}

// schedLR is lr with a schedule (--warmup, --lr-decay cosine), else 0 (the
// report leaves it out).
func schedLR(cfg models.GPTConfig, lr float64) float64 {
	if cfg.Scheduled() {
		return lr
	}
	return 0
}

// experts is v with --experts, else the zero value (the report leaves it
// out).
func experts[T int | float64](cfg models.GPTConfig, v T) T {
	if cfg.Experts == 0 {
		return 0
	}
	return v
}

// train runs the steps after t.startStep: each draws a batch from rng (a
// resumed run first draws the batches it skips, so the batches are those of
// a run from step 1), steps g, reports progress on rank 0 and saves when a
// save is due.
func (t *gptTask) train(ctx context.Context, env Env, w *collective.World, g gptModel, run gptRun, tr *tracer, b gptBatch, rng *rand.Rand, sv *saves, comms *stepComms) (trainLosses, error) {
	cfg, c, steps := t.cfg, t.corpus, t.steps
	var tl trainLosses
	var profiled time.Duration // the steps after the first, with --op-profile
	// Rank 0 profiles; under pp each stage's first rank does, its stage's.
	if pr, pp := run.(*ppRun); t.opProfile && (w.Rank() == 0 && !pp || pp && pr.local == 0) {
		of := ""
		if pp {
			of = fmt.Sprintf("stage %d", pr.s)
		}
		defer func() { tr.profileTable(env.Stderr, of, steps-t.startStep-1, profiled) }()
	}
	for s := 1; s <= t.startStep; s++ {
		c.batch(rng, c.train, cfg.Batch, cfg.Context, b.ids.Float32(), b.targets.Float32())
	}
	for s := t.startStep + 1; s <= steps; s++ {
		comms.reset()
		c.batch(rng, c.train, cfg.Batch, cfg.Context, b.ids.Float32(), b.targets.Float32())
		tr.take("kernel")
		tr.take("collective")
		start := time.Now()
		loss, err := run.step(ctx, b)
		if err != nil {
			return tl, err
		}
		d := time.Since(start)
		env.Run.Step(comms.stepRecord(s, loss, d, tr.take("kernel"), tr.take("collective")))
		tl.stepMS = append(tl.stepMS, ms(d))
		if s == t.startStep+1 {
			tl.first = loss
			if t.opProfile {
				tr.profile() // from the second step: the first loads modules and picks algorithms
			}
		} else {
			profiled += d
		}
		tl.last = loss
		tl.aux, tl.balance, tl.ringBytes, tl.cpAttention = g.AuxLoss(), g.Balance(), g.RingBytes(), g.cpAttention()
		tl.gradNorm, tl.lr = g.GradNorm(), cfg.LRAt(s)
		if w.Rank() == 0 {
			env.Run.Progress(s, steps, loss, d)
			line := fmt.Sprintf("step %d/%d loss %.4f time %.1f ms", s, steps, loss, ms(d))
			if cfg.Experts > 0 {
				line += fmt.Sprintf(" aux %.5f balance %.4f", tl.aux, tl.balance)
			}
			if cfg.ClipGrad > 0 {
				line += fmt.Sprintf(" grad norm %.4f", tl.gradNorm)
			}
			if cfg.Scheduled() {
				line += fmt.Sprintf(" lr %.4g", tl.lr)
			}
			fmt.Fprintln(env.Stdout, line)
		}
		if t.evalEvery > 0 && s%t.evalEvery == 0 {
			held, err := t.heldOutLoss(ctx, run, b)
			if err != nil {
				return tl, err
			}
			tl.curve = append(tl.curve, HeldOutPoint{s, held})
			if w.Rank() == 0 {
				fmt.Fprintf(env.Stdout, "held-out loss %.4f after step %d\n", held, s)
			}
		}
		if err := sv.step(ctx, w, g.State(), s, steps); err != nil {
			return tl, err
		}
	}
	return tl, nil
}

// heldOutLoss is the mean loss over t.heldOut batches of held-out text: the
// same windows on every rank.
func (t *gptTask) heldOutLoss(ctx context.Context, run gptRun, b gptBatch) (float64, error) {
	cfg, c := t.cfg, t.corpus
	vrng := rand.New(rand.NewPCG(cfg.Seed, 0x76616c))
	var held float64
	for i := 0; i < t.heldOut; i++ {
		c.batch(vrng, c.valid, cfg.Batch, cfg.Context, b.ids.Float32(), b.targets.Float32())
		l, err := run.loss(ctx, b)
		if err != nil {
			return 0, err
		}
		held += l / float64(t.heldOut)
	}
	return held, nil
}

// generate samples t.sample characters after a held-out prompt, the same
// on every rank (the distributions are gathered whole, the rng shared).
func (t *gptTask) generate(ctx context.Context, run gptRun, rng *rand.Rand) (string, error) {
	c, cfg := t.corpus, t.cfg
	ctxIDs := slices.Clone(c.valid[:cfg.Context/2])
	out := []byte{}
	host := tensor.New(tensor.Float32, cfg.Tokens())
	for len(out) < t.sample {
		// The window in the first sequence; the rest of the batch does not
		// reach its last position (attention is causal).
		window := ctxIDs[max(0, len(ctxIDs)-cfg.Context):]
		for i, id := range window {
			host.Float32()[i] = float32(id)
		}
		p, err := run.next(ctx, host, len(window)-1, t.temp)
		if err != nil {
			return "", err
		}
		u, next := rng.Float64(), len(p)-1
		for i, q := range p {
			if u -= q; u < 0 {
				next = i
				break
			}
		}
		ctxIDs = append(ctxIDs, next)
		out = append(out, c.chars[next])
	}
	prompt := make([]byte, 0, cfg.Context/2)
	for _, id := range c.valid[:cfg.Context/2] {
		prompt = append(prompt, c.chars[id])
	}
	return string(prompt) + "|" + string(out), nil
}
