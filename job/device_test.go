package job

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/kernels/sim"
	"github.com/meshrun/meshrun/spmd/spmdtest"
)

// TestMLPOnSim: the block trained on the sim device prints the losses of the
// cpu run, bit for bit, and copies nothing between host and device in a step
// but the loss (one float64); its collectives cross through host memory
// (staged), counted apart.
func TestMLPOnSim(t *testing.T) {
	for _, mesh := range []string{"tp=2", "tp=1", "dp=2,tp=2"} {
		var reports [2]MLPReport
		var losses [2]string
		for i, dev := range []string{"cpu", "sim"} {
			code, out, errs := run(t, "mlp", "--mesh", mesh, "--tokens", "16", "--hidden", "8", "--steps", "3", "--device", dev)
			if code != 0 {
				t.Fatalf("%s %s: exit %d: %s", mesh, dev, code, errs)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &reports[i]); err != nil {
				t.Fatal(err)
			}
			for _, l := range lines[:len(lines)-1] {
				losses[i] += strings.Split(l, " time ")[0] + "\n"
			}
		}
		cpu, sim := reports[0], reports[1]
		if losses[0] != losses[1] || cpu.LossFirst != sim.LossFirst || cpu.LossLast != sim.LossLast {
			t.Errorf("%s: losses differ:\ncpu %s sim %s", mesh, losses[0], losses[1])
		}
		if sim.Device != "sim:0" || cpu.Device != "cpu" || sim.Kernels != "sim" {
			t.Errorf("%s: devices %q %q kernels %q", mesh, cpu.Device, sim.Device, sim.Kernels)
		}
		if sim.H2DBytesPerStep != 0 || sim.D2HBytesPerStep != 8 || sim.D2HCopiesPerStep != 1 || sim.H2DCopiesPerStep != 0 {
			t.Errorf("%s: sim step copied h2d %d B (%d copies), d2h %d B (%d copies); want 0 and the loss's 8 B",
				mesh, sim.H2DBytesPerStep, sim.H2DCopiesPerStep, sim.D2HBytesPerStep, sim.D2HCopiesPerStep)
		}
		if cpu.H2DBytesPerStep != 0 || cpu.D2HBytesPerStep != 0 || cpu.StagedBytesPerStep != 0 {
			t.Errorf("%s: cpu run reports copies %+v", mesh, cpu)
		}
		if (sim.StagedBytesPerStep > 0) != (mesh != "tp=1") {
			t.Errorf("%s: staged %d bytes", mesh, sim.StagedBytesPerStep)
		}
	}
}

// TestMLPOnSimNCCL: with the nccl backend over the fake library
// (MESHRUN_NCCL_LIBRARY=fake) the sim run's losses are still the cpu run's,
// bit for bit (the fake reduces as the host collectives do), and nothing is
// staged through host memory: the library moved the device buffers. The
// in-process ranks are on sim devices of their own (sim.SeparateDevices), as
// ranks with a GPU each are: NCCL refuses ranks sharing one.
func TestMLPOnSimNCCL(t *testing.T) {
	env := map[string]string{"MESHRUN_NCCL_LIBRARY": "fake", "MESHRUN_COLLECTIVES": "nccl"}
	defer sim.SeparateDevices()()
	for _, mesh := range []string{"tp=2", "dp=2,tp=2", "tp=3"} {
		var reports [2]MLPReport
		for i, dev := range []string{"cpu", "sim"} {
			code, out, errs := runEnv(t, env, "mlp", "--mesh", mesh, "--tokens", "15", "--hidden", "9", "--steps", "3", "--device", dev)
			if code != 0 {
				t.Fatalf("%s %s: exit %d: %s", mesh, dev, code, errs)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &reports[i]); err != nil {
				t.Fatal(err)
			}
		}
		cpu, nccl := reports[0], reports[1]
		if cpu.LossFirst != nccl.LossFirst || cpu.LossLast != nccl.LossLast {
			t.Errorf("%s: losses differ: cpu %v..%v, nccl %v..%v", mesh, cpu.LossFirst, cpu.LossLast, nccl.LossFirst, nccl.LossLast)
		}
		if nccl.StagedBytesPerStep != 0 || nccl.H2DBytesPerStep != 0 || nccl.D2HBytesPerStep != 8 || len(nccl.Collectives) == 0 {
			t.Errorf("%s: staged %d B, h2d %d B, d2h %d B per step, collectives %v", mesh, nccl.StagedBytesPerStep, nccl.H2DBytesPerStep, nccl.D2HBytesPerStep, nccl.Collectives)
		}
	}
	// Every layout of verify, its redistributions on the nccl backend.
	if code, out, errs := runEnv(t, env, "verify", "--world", "3", "--device", "sim", "--quick"); code != 0 || !strings.Contains(out, "passed") {
		t.Fatalf("verify: exit %d\n%s%s", code, out, errs)
	}
}

// TestSimNCCLSharedDevice: in-process ranks share one device (sim:0 of the
// process, as in-process ranks share one GPU). With the fake library there,
// auto takes staged collectives (the cpu run's losses, staged bytes counted);
// MESHRUN_COLLECTIVES=nccl is refused before any step, naming the ranks and
// the device.
func TestSimNCCLSharedDevice(t *testing.T) {
	env := map[string]string{"MESHRUN_NCCL_LIBRARY": "fake", "MESHRUN_COLLECTIVES": "auto"}
	var reports [2]MLPReport
	for i, dev := range []string{"cpu", "sim"} {
		code, out, errs := runEnv(t, env, "mlp", "--mesh", "tp=2", "--tokens", "15", "--hidden", "9", "--steps", "2", "--device", dev)
		if code != 0 {
			t.Fatalf("auto, %s: exit %d: %s", dev, code, errs)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &reports[i]); err != nil {
			t.Fatal(err)
		}
	}
	if cpu, staged := reports[0], reports[1]; cpu.LossLast != staged.LossLast || staged.StagedBytesPerStep == 0 {
		t.Errorf("auto: loss %v (cpu %v), staged %d B per step", staged.LossLast, cpu.LossLast, staged.StagedBytesPerStep)
	}
	env["MESHRUN_COLLECTIVES"] = "nccl"
	code, out, errs := runEnv(t, env, "mlp", "--mesh", "tp=2", "--tokens", "15", "--hidden", "9", "--steps", "2", "--device", "sim")
	want := "ranks 0 and 1 share device " + sim.NewMemory(0).DeviceID()
	if code != 1 || strings.Contains(out, "step") || !strings.Contains(errs, "ranks share a device") || !strings.Contains(errs, want) {
		t.Errorf("nccl: exit %d, stdout %q, stderr %q (want %q)", code, out, errs, want)
	}
}

// TestVerifyOnSim: every case of verify at world 3 passes with the layers on
// the sim device.
func TestVerifyOnSim(t *testing.T) {
	code, out, errs := run(t, "verify", "--world", "3", "--device", "sim")
	if code != 0 || !strings.Contains(out, "passed") || strings.Contains(out, "FAIL") {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
}

// TestDeviceFlags: a device or provider this build lacks, or a provider of
// another device, is a usage error before anything runs, naming the fix.
func TestDeviceFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"mlp", "--device", "cpu", "--kernels", "sim"}, "provider sim runs on sim"},
		{[]string{"mlp", "--device", "tpu"}, `--device "tpu"`},
		{[]string{"verify", "--kernels", "nosuch"}, "unknown provider"},
	}
	if !providers.Compiled("cuda") {
		cases = append(cases,
			struct {
				args []string
				want string
			}{[]string{"mlp", "--device", "cuda"}, "go build -tags cuda"},
			struct {
				args []string
				want string
			}{[]string{"linear", "--mesh", "2", "--x", "4x4:[R]", "--w", "4x4:[S(0)]", "--kernels", "cuda"}, "go build -tags cuda"})
	}
	for _, tc := range cases {
		code, out, errs := run(t, tc.args...)
		if code != ExitUsage || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q (want %q)", tc.args, code, out, errs, tc.want)
		}
	}
}

// TestMLPBFloat16: mixed precision halves the bytes on the wire, keeps the loss
// within 1e-2 of the float32 run, and reduces gradients in float32 when asked.
func TestMLPBFloat16(t *testing.T) {
	model := spmdtest.LargeLayersFile(t) // data parallel over dp even at these sizes
	report := func(args ...string) MLPReport {
		t.Helper()
		return mlpRun(t, append([]string{"--tokens", "32", "--hidden", "16", "--steps", "20", "--model", model}, args...)...)
	}
	for _, mesh := range []string{"tp=2", "dp=2,tp=2"} {
		f32 := report("--mesh", mesh)
		bf := report("--mesh", mesh, "--dtype", "bfloat16")
		if bf.DType != "bfloat16" || f32.DType != "float32" {
			t.Fatalf("dtypes %q %q", f32.DType, bf.DType)
		}
		// The loss scalar's all-reduce (dp meshes) is a float64 in both.
		data := func(r MLPReport) int64 { return r.CommBytesPerStep - 8*int64(r.Collectives["all_reduce loss"]) }
		if 2*data(bf) != data(f32) {
			t.Errorf("%s: bf16 moves %d bytes a step, float32 %d: want exactly half", mesh, bf.CommBytesPerStep, f32.CommBytesPerStep)
		}
		if rel := math.Abs(bf.LossLast-f32.LossLast) / f32.LossLast; rel > 1e-2 || bf.LossLast >= bf.LossFirst {
			t.Errorf("%s: loss after 20 steps %v (bf16) vs %v (float32): %.2g relative", mesh, bf.LossLast, f32.LossLast, rel)
		}
		// Gradients reduced in float32 on the wire: dp moves float32 weight
		// gradients, so more bytes than bf16 end to end.
		if mesh == "dp=2,tp=2" {
			g32 := report("--mesh", mesh, "--dtype", "bfloat16", "--grad-dtype", "float32")
			if g32.CommBytesPerStep <= bf.CommBytesPerStep {
				t.Errorf("--grad-dtype float32 moved %d bytes, bf16 wire %d", g32.CommBytesPerStep, bf.CommBytesPerStep)
			}
		}
	}
}

// TestVerifyBFloat16: every case of verify passes in bfloat16 at world sizes 1
// to 4 (the full set at 1-3 and on dp=2,tp=2 quick).
func TestVerifyBFloat16(t *testing.T) {
	for _, args := range [][]string{
		{"--world", "1"}, {"--world", "2"}, {"--world", "3"}, {"--world", "4", "--quick"}, {"--world", "3", "--device", "sim"},
	} {
		code, out, errs := run(t, append([]string{"verify", "--dtype", "bfloat16"}, args...)...)
		if code != 0 || !strings.Contains(out, "passed") || strings.Contains(out, "FAIL") {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errs)
		}
	}
}
