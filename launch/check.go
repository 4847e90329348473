package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshrun/meshrun/natsconn"
	"github.com/meshrun/meshrun/runlog"
)

// EnvCheck mirrors job.EnvCheck (launch does not import job): set to 1, the
// worker parses and checks its workload's arguments as a rank would, does no
// work, and exits 0, or 2 with the problem on stderr.
const EnvCheck = "MESHRUN_CHECK"

// checkTimeout bounds the check of a workload's arguments.
const checkTimeout = 10 * time.Second

// errWorkload is a workload's arguments the worker refused: its one line.
type errWorkload string

func (e errWorkload) Error() string { return string(e) }
func (e errWorkload) Unwrap() error { return ErrInvalid }

// checkWorkload runs the worker once in check mode (EnvCheck=1), with the
// environment rank 0 of the job gets, before any rank starts and before the
// job folder exists: arguments the worker refuses (a flag misspelt, a mesh
// that does not match the world size, a shape that does not divide, a
// checkpoint that is missing, a dtype or provider this build lacks) are an
// error wrapping ErrInvalid with the worker's message. A program (after --,
// or a Python script) is not checked; nor does a worker that cannot start,
// exits otherwise, or takes longer than checkTimeout stop the job: it then
// runs, and fails, as it would have.
func (j *job) checkWorkload() error {
	if _, _, workload := j.command(); !workload {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, j.path, j.args...)
	cmd.Env = j.checkEnv()
	stderr := &capped{max: 64 << 10}
	cmd.Stderr = stderr
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		fmt.Fprintf(j.Stderr, "launcher: checking the workload's arguments took over %v; starting the ranks without the check\n", checkTimeout)
		return nil
	case errors.As(err, &exit) && exit.ExitCode() == ExitUsage:
		msg, _, _ := strings.Cut(strings.TrimSpace(stderr.b.String()), "\n")
		if msg == "" {
			msg = fmt.Sprintf("%s refused the arguments %q (exit %d)", j.path, j.args, ExitUsage)
		}
		return errWorkload(msg)
	}
	return nil
}

// checkEnv is the environment of the check: rank 0's, as the ranks get it
// (see the start of a rank), with no NATS server, no rank folder, and
// EnvCheck=1.
func (j *job) checkEnv() []string {
	common := j.commonEnv(natsconn.Config{})
	env := os.Environ()
	if _, ok := common[EnvKernels]; !ok {
		env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, EnvKernels+"=") })
	}
	for k, v := range common {
		env = append(env, k+"="+v)
	}
	r := j.ranks[0]
	env = append(env, "RANK=0", "LOCAL_RANK=0", "GOMAXPROCS="+strconv.Itoa(r.GOMAXPROCS), runlog.EnvRankDir+"=", EnvCheck+"=1")
	if r.GPU != "" {
		env = append(env, "CUDA_VISIBLE_DEVICES="+r.GPU)
	}
	return env
}

// capped keeps the first max bytes written to it.
type capped struct {
	b   bytes.Buffer
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	if n := c.max - c.b.Len(); n > 0 {
		c.b.Write(p[:min(n, len(p))])
	}
	return len(p), nil
}
