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

	"github.com/meshrun/meshrun/bootstrap/natsconn"
	"github.com/meshrun/meshrun/runlog"
)

// EnvCheck mirrors job.EnvCheck (launch does not import job): set to 1, the
// worker parses and checks its workload's arguments as a rank would, does no
// work, and exits 0, or 2 with the problem on stderr.
const EnvCheck = "MESHRUN_CHECK"

// checkDevice, as EnvCheck's value, asks the worker for the ranks' device
// alone (job.CheckDevice mirrors it).
const checkDevice = "device"

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

// resolveDevice resolves the ranks' device (RunOptions.askDevice). Tests
// replace it to stand in for a cuda build.
var resolveDevice = RunOptions.askDevice

// buildCommand is how to build the launcher and worker with a build tag, as
// the worker names it when it lacks a provider.
func buildCommand(tag string) string {
	return fmt.Sprintf("go build -tags %s -o bin/ ./cmd/launcher ./cmd/worker", tag)
}

// askDevice resolves the ranks' device ("cpu", "sim" or "cuda"). The device
// is the launcher's own: it names one of cpu, sim and cuda, and cuda ranks
// need a launcher built with the cuda tag, which hands each a GPU. The
// kernels providers are the worker's: the launcher links none, so with
// --kernels or --dtype it runs the worker once in check mode
// (EnvCheck=device) with the environment the ranks would get, before any
// rank starts, for a program's job as for a workload's; the worker resolves
// the device from the providers it has, or refuses what it lacks with the
// one line the launcher reports.
func (o RunOptions) askDevice() (string, error) {
	dev := o.deviceName()
	switch dev {
	case "", "cpu", "sim", "cuda":
	default:
		return "", fmt.Errorf("--device %q: want cpu, sim or cuda", dev)
	}
	if dev == "cuda" && !launcherCUDA {
		return "", fmt.Errorf("--device %s: this binary was built without CUDA support; build with: %s", dev, buildCommand("cuda"))
	}
	if o.Kernels == "" && o.DType == "" {
		if dev == "" {
			dev = "cpu"
		}
		return dev, nil
	}
	what := "--kernels"
	if o.Kernels == "" {
		what = "--dtype"
	}
	path, err := o.workerPath()
	if err != nil {
		return "", fmt.Errorf("%s: the worker checks it: %v", what, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		for _, k := range []string{EnvCheck, EnvDevice, EnvKernels, EnvDType} {
			if strings.HasPrefix(kv, k+"=") {
				return true
			}
		}
		return false
	})
	cmd.Env = append(cmd.Env, EnvCheck+"="+checkDevice, EnvDevice+"="+dev, EnvKernels+"="+o.Kernels, EnvDType+"="+o.DType)
	stdout, stderr := &capped{max: 4 << 10}, &capped{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = time.Second
	err = cmd.Run()
	msg, _, _ := strings.Cut(strings.TrimSpace(stderr.b.String()), "\n")
	var exit *exec.ExitError
	switch {
	case err == nil:
		switch got := strings.TrimSpace(stdout.b.String()); got {
		case "cuda":
			if !launcherCUDA {
				return "", fmt.Errorf("%s %s: this launcher was built without CUDA support, which places cuda ranks on GPUs; build with: %s", what, o.Kernels, buildCommand("cuda"))
			}
			return got, nil
		case "cpu", "sim":
			return got, nil
		default:
			return "", fmt.Errorf("%s: the worker %s, asked for the ranks' device, answered %q", what, path, got)
		}
	case ctx.Err() != nil:
		return "", fmt.Errorf("%s: the worker %s, asked for the ranks' device, took over %v", what, path, checkTimeout)
	case errors.As(err, &exit) && exit.ExitCode() == ExitUsage && msg != "":
		return "", errors.New(msg)
	case msg != "":
		return "", fmt.Errorf("%s: the worker %s, asked for the ranks' device: %v: %s", what, path, err, msg)
	}
	return "", fmt.Errorf("%s: the worker %s, asked for the ranks' device: %v", what, path, err)
}
