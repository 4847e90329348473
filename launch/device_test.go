package launch

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/bootstrap/natsconn"
	"github.com/meshrun/meshrun/kernels/providers/catalog"
)

// cudaBuild is the command a refusal of --device cuda or --kernels cuda names
// in a build without CUDA.
var cudaBuild = catalog.BuildCommand("cuda")

// pretendCUDA makes the launcher accept --device cuda (and --kernels cuda) as
// a cuda build would, for the tests of what the launcher does with GPUs; it
// changes nothing in a cuda build.
func pretendCUDA(t *testing.T) {
	t.Helper()
	if catalog.Compiled("cuda") {
		return
	}
	real := resolveDevice
	resolveDevice = func(o RunOptions) (string, error) {
		device, spec := o.deviceName(), o.Kernels
		if (device == "cuda" || device == "") && (spec == "" || spec == "cuda") && device+spec != "" {
			return "cuda", nil
		}
		return real(o)
	}
	t.Cleanup(func() { resolveDevice = real })
}

// setCUDAVisible sets CUDA_VISIBLE_DEVICES for the test; "-" unsets it.
func setCUDAVisible(t *testing.T, v string) {
	t.Helper()
	t.Setenv("CUDA_VISIBLE_DEVICES", "") // restored after the test
	if v == "-" {
		os.Unsetenv("CUDA_VISIBLE_DEVICES")
		return
	}
	os.Setenv("CUDA_VISIBLE_DEVICES", v)
}

// TestDeviceFlags checks --device, --kernels and --share-gpus (and their
// MESHRUN_* defaults) as Validate sees them, before anything starts. Cases
// marked cuda need a cuda build: in other builds they must be refused naming
// the build command, and every other problem must still be reported.
func TestDeviceFlags(t *testing.T) {
	cudaCompiled := catalog.Compiled("cuda")
	tests := []struct {
		name string
		args []string
		env  map[string]string
		cvd  string // CUDA_VISIBLE_DEVICES; "-" unset
		cuda bool   // valid in a cuda build, refused naming the build elsewhere
		dev  string // the ranks' device when valid
		want []string
		not  []string
	}{
		{name: "default", args: []string{"mlp"}, cvd: "-", dev: "cpu"},
		{name: "sim", args: []string{"--device", "sim", "mlp"}, cvd: "-", dev: "sim"},
		{name: "kernels imply their device", args: []string{"--kernels", "sim", "mlp"}, cvd: "-", dev: "sim"},
		{name: "from the environment", args: []string{"mlp"}, env: map[string]string{"MESHRUN_DEVICE": "sim", "MESHRUN_KERNELS": "sim"}, cvd: "-", dev: "sim"},
		{name: "program mode checks the device too", args: []string{"--device", "sim", "--", "sh", "-c", "true"}, cvd: "-", dev: "sim"},
		{name: "cpu tensors, sim kernels", args: []string{"--device", "cpu", "--kernels", "sim", "mlp"}, cvd: "-",
			want: []string{"--kernels sim: provider sim runs on sim, the rank's tensors are on cpu"}},
		{name: "unknown device", args: []string{"--device", "tpu", "mlp"}, cvd: "-", want: []string{`--device "tpu": want cpu, sim or cuda`}},
		{name: "bfloat16", args: []string{"--dtype", "bfloat16", "mlp"}, cvd: "-", dev: "cpu"},
		{name: "unknown dtype", args: []string{"--dtype", "fp8", "mlp"}, cvd: "-", want: []string{`--dtype "fp8": want float32 or bfloat16`}},
		{name: "unknown provider", args: []string{"--kernels", "nosuch", "mlp"}, cvd: "-", want: []string{`unknown provider "nosuch"`}},
		{name: "gpu ranks on sim", args: []string{"-n", "gpu", "--device", "sim", "mlp"}, cvd: "-", want: []string{"--device sim contradicts it"}},
		{name: "share-gpus without cuda", args: []string{"--share-gpus", "mlp"}, cvd: "-", want: []string{"--share-gpus with --device cpu"}},
		{name: "device cuda", args: []string{"-n", "2", "--device", "cuda", "mlp"}, cvd: "0,1", cuda: true, dev: "cuda"},
		{name: "kernels cuda", args: []string{"-n", "2", "--kernels", "cuda", "mlp"}, cvd: "0,1", cuda: true, dev: "cuda"},
		{name: "device cuda, program", args: []string{"-n", "2", "--device", "cuda", "--", "sh", "-c", "true"}, cvd: "0, 1", cuda: true, dev: "cuda"},
		{name: "more ranks than GPUs", args: []string{"-n", "4", "--device", "cuda", "mlp"}, cvd: "0,1", cuda: true,
			want: []string{"--nproc-per-node 4 with --device cuda needs 4 GPUs, CUDA_VISIBLE_DEVICES lists 2 (0,1); pass --share-gpus to let ranks share them"}},
		{name: "more ranks than GPUs, from the environment", args: []string{"mlp"}, env: map[string]string{"MESHRUN_DEVICE": "cuda", "MESHRUN_NPROC_PER_NODE": "3"},
			cvd: "7", cuda: true, want: []string{"needs 3 GPUs, CUDA_VISIBLE_DEVICES lists 1 (7)"}},
		{name: "shared GPUs", args: []string{"-n", "4", "--device", "cuda", "--share-gpus", "mlp"}, cvd: "0,1", cuda: true, dev: "cuda", not: []string{"needs"}},
		{name: "shared GPUs, from the environment", args: []string{"-n", "4", "--device", "cuda", "mlp"}, env: map[string]string{"MESHRUN_SHARE_GPUS": "true"},
			cvd: "0,1", cuda: true, dev: "cuda", not: []string{"needs"}},
		{name: "no GPU visible", args: []string{"--device", "cuda", "--share-gpus", "mlp"}, cvd: "", cuda: true,
			want: []string{"--device cuda: no GPU visible (CUDA_VISIBLE_DEVICES lists none)"}},
		{name: "every problem at once", args: []string{"-n", "0", "--device", "cpu", "--kernels", "sim", "--share-gpus"}, cvd: "-",
			want: []string{"--kernels sim: provider sim", "--nproc-per-node \"0\"", "no workload"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			setCUDAVisible(t, tc.cvd)
			o, err := ParseRunFlags(tc.args, func(k string) string { return tc.env[k] })
			if err != nil {
				t.Fatal(err)
			}
			o.Worker = worker() // asked for the ranks' device with --kernels or --dtype
			err = o.Validate()
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("want one line: %q", msg)
			}
			want := tc.want
			if tc.cuda && !cudaCompiled {
				want = append([]string{cudaBuild}, want...)
			}
			if len(want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				if dev, _ := o.rankDevice(); dev != tc.dev {
					t.Errorf("device %q, want %q", dev, tc.dev)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want %q", want)
			}
			for _, w := range want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q lacks %q", msg, w)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(msg, w) {
					t.Errorf("%q has %q", msg, w)
				}
			}
		})
	}
}

// TestRunNotBuiltForCUDA: in a build without CUDA, --device cuda and --kernels
// cuda (flags or MESHRUN_*) exit 2 naming the build command, and nothing
// starts: no job folder, no rank (the worker answers the launcher's question
// for the ranks' device, and nothing else).
func TestRunNotBuiltForCUDA(t *testing.T) {
	if catalog.Compiled("cuda") {
		t.Skip("a cuda build")
	}
	setCUDAVisible(t, "-")
	// A worker that leaves a mark if it ever runs as more than the device
	// check, which the real worker answers.
	dir := t.TempDir()
	mark := filepath.Join(dir, "ran")
	fake := filepath.Join(dir, "worker")
	script := "#!/bin/sh\nif [ \"$" + EnvCheck + "\" = " + checkDevice + " ]; then exec " + worker() + "; fi\ntouch " + mark + "\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
	}{
		{"--device cuda", []string{"-n", "2", "--device", "cuda", "mlp"}, nil},
		{"--kernels cuda", []string{"-n", "2", "--kernels", "cuda", "mlp"}, nil},
		{"--device cuda, program", []string{"-n", "2", "--device", "cuda", "--", fake}, nil},
		{"MESHRUN_DEVICE=cuda", []string{"-n", "2", "mlp"}, []string{"MESHRUN_DEVICE=cuda"}},
		{"MESHRUN_KERNELS=cuda", []string{"-n", "2", "mlp"}, []string{"MESHRUN_KERNELS=cuda"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logDir := t.TempDir()
			args := append([]string{"run", "--worker", fake, "--log-dir", logDir, "--job-id", "nocuda"}, tc.args...)
			cmd := exec.Command(filepath.Join(bin, "launcher"), args...)
			cmd.Env = append(os.Environ(), tc.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			if code := cmd.ProcessState.ExitCode(); code != ExitUsage {
				t.Fatalf("exit %d (%v), want %d; stderr:\n%s", code, err, ExitUsage, stderr.String())
			}
			if !strings.Contains(stderr.String(), cudaBuild) || strings.Count(stderr.String(), "\n") != 1 {
				t.Errorf("want one line naming %q, got:\n%s", cudaBuild, stderr.String())
			}
			if ents, _ := os.ReadDir(logDir); len(ents) != 0 {
				t.Errorf("the refused job left %v in the log dir", ents)
			}
			if _, err := os.Stat(mark); !os.IsNotExist(err) {
				t.Errorf("a worker ran: %v", err)
			}
		})
	}
}

// TestRunSharedGPUs: more cuda ranks than GPUs are refused unless
// --share-gpus, which deals the GPUs out round-robin (the dry-run table shows
// each rank's device and GPU).
func TestRunSharedGPUs(t *testing.T) {
	pretendCUDA(t)
	setCUDAVisible(t, "3,5")
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := Main(context.Background(), append([]string{"run", "--dry-run", "--job-id", "gpus", "--log-dir", t.TempDir()}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	code, _, stderr := run("-n", "4", "--device", "cuda", "--", "prog")
	if code != ExitUsage || !strings.Contains(stderr, "needs 4 GPUs, CUDA_VISIBLE_DEVICES lists 2 (3,5); pass --share-gpus") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
	code, stdout, stderr := run("-n", "4", "--device", "cuda", "--share-gpus", "--", "prog")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "device cuda") {
		t.Errorf("no device in the header:\n%s", stdout)
	}
	var gpus []string
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n")[2:] {
		f := strings.Fields(l)
		if len(f) < 7 || f[4] != "cuda" {
			t.Fatalf("row %q: want DEVICE cuda", l)
		}
		gpus = append(gpus, f[5])
	}
	if strings.Join(gpus, ",") != "3,5,3,5" {
		t.Errorf("GPUs %v, want 3,5,3,5:\n%s", gpus, stdout)
	}
}

// TestRunDeviceSim runs the MLP on the simulated device through the launcher:
// every rank gets MESHRUN_DEVICE=sim, and job.json records it.
func TestRunDeviceSim(t *testing.T) {
	code, dir, stdout, stderr := launch(t, "-n", "2", "--device", "sim", "mlp", "--tokens", "64", "--hidden", "32", "--steps", "2")
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	if !strings.Contains(stdout, `"device":"sim:0"`) || !strings.Contains(stdout, `"kernels":"sim"`) {
		t.Errorf("the MLP did not run on sim:\n%s", stdout)
	}
	rec := readJSON[JobRecord](t, filepath.Join(dir, JobFile))
	if rec.Device != "sim" || rec.Env[EnvDevice] != "sim" || rec.Kernels != "" || rec.Env[EnvKernels] != "" || rec.ShareGPUs {
		t.Errorf("job.json: device %q kernels %q share %v env %v", rec.Device, rec.Kernels, rec.ShareGPUs, rec.Env)
	}
}

// TestRunDeviceSimNCCL: worker processes on the sim device with the nccl
// backend over the fake library (MESHRUN_NCCL_LIBRARY=fake): the unique id
// and the communicators' bootstrap cross the launcher's NATS server, the
// losses are the cpu run's, nothing is staged, and each rank's log says which
// backend ran and why.
func TestRunDeviceSimNCCL(t *testing.T) {
	var losses [2]string
	for i, dev := range []string{"cpu", "sim"} {
		if dev == "sim" {
			t.Setenv("MESHRUN_NCCL_LIBRARY", "fake")
			t.Setenv(envCollectives, "nccl")
		}
		code, dir, stdout, stderr := launch(t, "-n", "2", "--device", dev, "mlp", "--tokens", "33", "--hidden", "16", "--steps", "3")
		if code != 0 {
			t.Fatalf("%s: exit %d; stderr:\n%s", dev, code, stderr)
		}
		for _, l := range strings.Split(stdout, "\n") {
			if _, after, ok := strings.Cut(l, "| step "); ok {
				losses[i] += strings.Split(after, " time ")[0] + "\n"
			}
		}
		if dev == "sim" {
			if !strings.Contains(stdout, `"staged_bytes_per_step":0`) {
				t.Errorf("staged:\n%s", stdout)
			}
			for r := range 2 {
				log, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%05d", r), "log.jsonl"))
				if err != nil || !strings.Contains(string(log), `"backend":"nccl","why":"chosen (MESHRUN_COLLECTIVES=nccl)"`) {
					t.Errorf("rank %d log: %v\n%s", r, err, log)
				}
			}
		}
	}
	if losses[0] == "" || losses[0] != losses[1] {
		t.Errorf("losses differ:\ncpu\n%s\nsim/nccl\n%s", losses[0], losses[1])
	}
}

// TestRunDeviceEnv: any program sees the resolved device and the --kernels
// given; without --kernels, a MESHRUN_KERNELS the launcher inherited does not
// reach the ranks.
func TestRunDeviceEnv(t *testing.T) {
	script := `echo "device=$MESHRUN_DEVICE kernels=${MESHRUN_KERNELS-unset}"`
	t.Run("kernels", func(t *testing.T) {
		code, dir, stdout, stderr := launch(t, "-n", "2", "--kernels", "sim", "--", "sh", "-c", script)
		if code != 0 {
			t.Fatalf("exit %d; stderr:\n%s", code, stderr)
		}
		if !strings.Contains(stdout, "ranks[0-1]: device=sim kernels=sim\n") {
			t.Errorf("console:\n%s", stdout)
		}
		if rec := readJSON[JobRecord](t, filepath.Join(dir, JobFile)); rec.Device != "sim" || rec.Kernels != "sim" || rec.Env[EnvKernels] != "sim" {
			t.Errorf("job.json: %+v", rec)
		}
	})
	t.Run("dtype", func(t *testing.T) {
		code, dir, stdout, stderr := launch(t, "-n", "2", "--dtype", "bfloat16", "--", "sh", "-c", `echo "dtype=$MESHRUN_DTYPE"`)
		if code != 0 {
			t.Fatalf("exit %d; stderr:\n%s", code, stderr)
		}
		if !strings.Contains(stdout, "ranks[0-1]: dtype=bfloat16\n") {
			t.Errorf("console:\n%s", stdout)
		}
		if rec := readJSON[JobRecord](t, filepath.Join(dir, JobFile)); rec.DType != "bfloat16" || rec.Env[EnvDType] != "bfloat16" {
			t.Errorf("job.json: %+v", rec)
		}
	})
	t.Run("no kernels", func(t *testing.T) {
		t.Setenv(EnvKernels, "nosuch")
		code, _, stdout, stderr := launch(t, "-n", "2", "--kernels=", "--", "sh", "-c", script)
		if code != 0 {
			t.Fatalf("exit %d; stderr:\n%s", code, stderr)
		}
		if !strings.Contains(stdout, "ranks[0-1]: device=cpu kernels=unset\n") {
			t.Errorf("console:\n%s", stdout)
		}
	})
}

// TestSharedGPUsStaged: ranks sharing a GPU get MESHRUN_COLLECTIVES=staged
// (NCCL refuses two ranks of one communicator on one GPU), unless the
// launcher's environment chose a backend; ranks on GPUs of their own do not.
func TestSharedGPUsStaged(t *testing.T) {
	t.Setenv(envCollectives, "")
	os.Unsetenv(envCollectives)
	shared := &job{device: "cuda", ranks: []rankSpec{{GPU: "3"}, {GPU: "5"}, {GPU: "3"}}}
	own := &job{device: "cuda", ranks: []rankSpec{{GPU: "3"}, {GPU: "5"}}}
	if got := shared.commonEnv(natsconn.Config{})[envCollectives]; got != "staged" {
		t.Errorf("shared GPUs: %s=%q, want staged", envCollectives, got)
	}
	if got, ok := own.commonEnv(natsconn.Config{})[envCollectives]; ok {
		t.Errorf("a GPU each: %s=%q set", envCollectives, got)
	}
	t.Setenv(envCollectives, "nccl")
	if got, ok := shared.commonEnv(natsconn.Config{})[envCollectives]; ok {
		t.Errorf("the user's choice overridden: %q", got)
	}
}
