package job

import (
	"flag"

	"github.com/meshrun/meshrun/ckpt"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/placement"
)

// training is what the training workloads (mlp, gpt) share: the flags of
// the mesh, steps, device, checkpoints and profile; from setup, the mesh,
// the ranks' device, and the checkpoint to start from (nil: none), its step
// and whether a restart resumed from --save.
type training struct {
	mesh    string
	steps   int
	profile string
	// opProfile: --op-profile, each kernel's and collective's time per step
	// on rank 0's stderr.
	opProfile bool
	df        deviceFlags
	cf        ckptFlags

	m           placement.Mesh
	rd          rankDevice
	ck          *ckpt.Checkpoint
	startStep   int
	autoResumed bool
}

// register adds the shared flags (--mesh described by meshUsage; --steps is
// the workload's, its default differs).
func (t *training) register(fs *flag.FlagSet, meshUsage string) {
	fs.StringVar(&t.mesh, "mesh", "", meshUsage)
	fs.StringVar(&t.profile, "cpuprofile", "", "write a CPU profile of the steps to `FILE`, %r in it replaced by the rank (launched ranks: each its own; in-process ranks share one profile, %r read as all)")
	fs.BoolVar(&t.opProfile, "op-profile", false, "print each kernel's and collective's calls and time per step (after the first step) on rank 0's stderr (gpt with pp: each stage's, on its first rank's); on cuda with MESHRUN_CUDA_SYNC=1 each kernel's time is its own")
	t.df.register(fs)
	t.cf.register(fs)
}

// prepare checks the mesh against the world and resolves the ranks' device.
func (t *training) prepare(env Env) (err error) {
	if t.m, err = workloadMesh(env, t.mesh); err != nil {
		return err
	}
	t.rd, err = t.df.resolve(env)
	return err
}

// resume opens the checkpoint the flags (or a restart) name for params.
func (t *training) resume(env Env, params []linear.Param) (err error) {
	t.ck, t.startStep, t.autoResumed, err = t.cf.open(env, params, t.steps)
	return err
}
