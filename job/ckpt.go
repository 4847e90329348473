package job

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/linear"
	"go.uber.org/zap"
)

// ckptFlags are the training tasks' checkpoint flags (mlp's and gpt's).
type ckptFlags struct {
	save         string
	every, keep  int
	sync         bool
	resume, init string
	saveErrors   string
}

// Values of --save-errors.
const (
	saveErrorsStop     = "stop"
	saveErrorsContinue = "continue"
)

// saveFS, when a test sets it, wraps the file system each rank's save of a
// step goes through (faults injected, a full disk), and may act before the
// save (free space, fill the disk); it runs on every rank before the save's
// first barrier.
var saveFS func(rank, step int, fsys ckpt.FS) ckpt.FS

func (c *ckptFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.save, "save", "", "save checkpoints into `DIR` (one folder step-N per checkpoint)")
	fs.IntVar(&c.every, "save-every", 0, "with --save: save every `N` steps (0: at the end only)")
	fs.IntVar(&c.keep, "keep", 3, "with --save: keep the newest `K` checkpoints (0: all)")
	fs.BoolVar(&c.sync, "save-sync", true, "with --save: fsync the files and folders (false: a checkpoint survives any process dying, not the machine losing power)")
	fs.StringVar(&c.saveErrors, "save-errors", saveErrorsStop, "with --save: what a save that fails (a full disk, EIO) does, `POLICY` stop (end the run) or continue (warn and train on; the next save tries again)")
	fs.StringVar(&c.resume, "resume", "", "resume from `PATH`: a folder of checkpoints (its newest), one (DIR/step-N), or a safetensors file")
	fs.StringVar(&c.init, "init", "", "start from the weights in `FILE`, a safetensors file of the parameters under PyTorch's names (mlp: up.weight, up.bias, down.weight, down.bias; gpt: GPT-2's, wte.weight, h.0.attn.c_attn.weight, …)")
}

// open checks --resume or --init against the model before any rank starts and
// returns the checkpoint (nil when none) and the step it was saved at.
//
// On a restart (restart > 0: the launcher's TORCHELASTIC_RESTART_COUNT) with
// --save DIR and no --resume, it resumes from DIR's newest checkpoint, the
// last one the failed attempt saved (before --init: the run goes on from
// where it was); with none there yet, the run starts over as the first
// attempt did. auto reports that resume.
func (c ckptFlags) open(env Env, ps []linear.Param, steps int) (ck *ckpt.Checkpoint, step int, auto bool, err error) {
	restart, _ := strconv.Atoi(env.Getenv(EnvRestartCount))
	if restart > 0 && c.save != "" && c.resume == "" {
		if _, err := ckpt.Open(ckpt.OS, c.save); err == nil {
			c.resume, c.init, auto = c.save, "", true
		} else if !errors.Is(err, ckpt.ErrNone) {
			return nil, 0, false, fmt.Errorf("restart %d: resuming from --save %s: %w", restart, c.save, err)
		}
	}
	ck, step, err = c.openFlags(ps, steps)
	return ck, step, auto, err
}

// openFlags is open for --resume and --init as given.
func (c ckptFlags) openFlags(ps []linear.Param, steps int) (*ckpt.Checkpoint, int, error) {
	if c.every < 0 || c.keep < 0 {
		return nil, 0, fmt.Errorf("--save-every and --keep must not be negative")
	}
	if c.every > 0 && c.save == "" {
		return nil, 0, fmt.Errorf("--save-every needs --save DIR")
	}
	if c.saveErrors != saveErrorsStop && c.saveErrors != saveErrorsContinue {
		return nil, 0, fmt.Errorf("--save-errors %q: want stop or continue", c.saveErrors)
	}
	path, flagName := c.resume, "--resume"
	if c.init != "" {
		if c.resume != "" {
			return nil, 0, fmt.Errorf("--resume and --init: pick one")
		}
		path, flagName = c.init, "--init"
	}
	if path == "" {
		return nil, 0, nil
	}
	ck, err := ckpt.Open(ckpt.OS, path)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", flagName, err)
	}
	if err := linear.Expect(ck, ps); err != nil {
		return nil, 0, fmt.Errorf("%s %s: %w", flagName, path, err)
	}
	step := 0
	if c.resume != "" {
		step = ck.Index.Step
	}
	if step >= steps {
		return nil, 0, fmt.Errorf("--resume %s is at step %d: --steps %d leaves nothing to train", path, step, steps)
	}
	return ck, step, nil
}

// waitAll waits for every rank of w.
func waitAll(ctx context.Context, w *collective.World) error {
	g, err := w.WorldGroup(ctx)
	if err != nil {
		return err
	}
	return g.Barrier(ctx)
}

// due reports whether step s is saved.
func (c ckptFlags) due(s, last int) bool {
	return c.save != "" && ((c.every > 0 && s%c.every == 0) || s == last)
}

// saveStep writes the checkpoint of step s (ps: what it holds) and returns how long it took.
func (c ckptFlags) saveStep(ctx context.Context, w *collective.World, ps []linear.Param, s int, view *collective.World, mesh string) (time.Duration, error) {
	fsys := ckpt.OS
	if !c.sync {
		fsys = ckpt.NoSync(fsys)
	}
	if saveFS != nil {
		fsys = saveFS(w.Rank(), s, fsys)
	}
	if err := waitAll(ctx, w); err != nil {
		return 0, err
	}
	start := time.Now()
	err := linear.SaveParams(ctx, w, ps, linear.SaveOptions{Root: c.save, Step: s, Keep: c.keep, FS: fsys, View: view, Mesh: mesh})
	return time.Since(start), err
}

// saves is a training loop's saving: each due save, and what --save-errors
// makes of a failed one.
type saves struct {
	cf       ckptFlags
	env      Env
	workload string
	// Failed counts the saves that failed and were skipped (--save-errors
	// continue); MS is the last successful save's time.
	Failed int
	MS     float64
	// view and mesh: a pipeline stage's view of its ranks, which its
	// parameters' layouts are over, and the world's mesh (SaveOptions).
	view *collective.World
	mesh string
}

// step saves step s of last if it is due. A failed save is the error that
// ends the rank, unless --save-errors continue and every rank agreed it
// failed (a *ckpt.SaveError: a rank that died or a collective that failed
// ends the run whatever the flag): then rank 0 warns, naming the failed
// ranks and the last good checkpoint, and training goes on.
func (sv *saves) step(ctx context.Context, w *collective.World, ps []linear.Param, s, last int) error {
	if !sv.cf.due(s, last) {
		return nil
	}
	d, err := sv.cf.saveStep(ctx, w, ps, s, sv.view, sv.mesh)
	var se *ckpt.SaveError
	switch {
	case err == nil:
		sv.MS = ms(d)
		if w.Rank() == 0 {
			fmt.Fprintf(sv.env.Stdout, "saved step %d to %s in %.1f ms\n", s, sv.cf.save, sv.MS)
		}
		return nil
	case !errors.As(err, &se):
		return err // a collective failed: the World is gone
	case sv.cf.saveErrors != saveErrorsContinue:
		// Every rank records the failure before any rank exits: the
		// launcher, judging the job when the first rank exits, then reads
		// every rank's record blaming the failed ranks, the first of them
		// having failed on its own (not a rank still running at teardown).
		sv.env.Run.Fail(err)
		waitAll(ctx, w)
		return err
	}
	sv.Failed++
	next := "the next save tries again"
	if s == last {
		next = "it was the run's last save"
	}
	if sv.env.Run != nil {
		sv.env.Run.Log.Warn("checkpoint not saved; training goes on (--save-errors continue)",
			zap.Int("step", s), zap.Ints("failed_ranks", se.Ranks()), zap.String("last_good", se.LastGood), zap.Error(err))
	}
	if w.Rank() == 0 {
		fmt.Fprintf(sv.env.Stderr, "%s: warning: %v; training goes on (--save-errors continue), %s\n", sv.workload, err, next)
	}
	return nil
}

// paramBytes is the size of a block's parameters (float32).
func paramBytes(ps []linear.Param) int64 {
	var n int64
	for _, p := range ps {
		n += 4 * p.Spec.NumElems()
	}
	return n
}

// corrupt reports whether err is a checkpoint that could not be loaded (the
// workload then exits with ExitUsage, as for any bad input).
func corrupt(err error) bool {
	return errors.Is(err, ckpt.ErrCorrupt) || errors.Is(err, ckpt.ErrFormat) || errors.Is(err, ckpt.ErrMismatch)
}
