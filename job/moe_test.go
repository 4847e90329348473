package job

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/internal/pythontest"
	"github.com/meshrun/meshrun/kernels/sim"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// writeMoEInputs writes a layer's inputs as float32 .npy into dir: T = 13
// tokens (no mesh below divides it), E = 6 experts of which the last gets
// no token (x's column 0 is 1, the router's weight there -8 for it).
func writeMoEInputs(t *testing.T, dir string, s spmd.MoEShape) {
	t.Helper()
	d := randomMoE(s, 11)
	for r := range s.T {
		d.x.Float32()[r*s.H] = 1
	}
	for e := range s.E {
		d.p.Router.Float32()[e*s.H] = 0
	}
	d.p.Router.Float32()[(s.E-1)*s.H] = -8
	for _, f := range []struct {
		name string
		t    *tensor.Tensor
	}{{"x", d.x}, {"router", d.p.Router}, {"w1", d.p.W1}, {"b1", d.p.B1}, {"w2", d.p.W2}, {"b2", d.p.B2}, {"dy", d.dy}} {
		if err := f.t.Save(filepath.Join(dir, f.name+".npy")); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMoEMatchesPyTorch runs `worker moe --load --dump` on the meshes ep=4,
// ep=2,tp=2, dp=2,ep=2 and ep=3 (13 tokens, E = 6, k = 2, an expert that
// receives nothing) and compares every output and gradient with PyTorch's
// autograd in float64 (spmd/spmdref/testdata/torch_moe.py): within 1e-5 of
// the largest value, relative.
func TestMoEMatchesPyTorch(t *testing.T) {
	py := pythontest.Python(t, "torch, numpy", "MESHRUN_REQUIRE_TORCH")
	s := spmd.MoEShape{T: 13, H: 16, F: 12, E: 6, K: 2}
	in, ref := t.TempDir(), t.TempDir()
	writeMoEInputs(t, in, s)
	for _, n := range moeFiles {
		b, err := os.ReadFile(filepath.Join(in, n+".npy"))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(ref, n+".npy"), b, 0o644)
	}
	const auxCoef = 0.37
	cfg, _ := json.Marshal(map[string]any{"T": s.T, "E": s.E, "k": s.K, "aux_coef": auxCoef, "capacity": 0})
	os.WriteFile(filepath.Join(ref, "config.json"), cfg, 0o644)
	script := filepath.Join("..", "spmd", "spmdref", "testdata", "torch_moe.py")
	if msg, err := exec.Command(py, script, ref).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, msg)
	}
	want := func(name string) []float64 {
		x, err := tensor.Load(filepath.Join(ref, name+".npy"))
		if err != nil {
			t.Fatal(err)
		}
		return x.Float64()
	}
	if tok := want("tokens"); tok[s.E-1] != 0 {
		t.Fatalf("expert %d got %v tokens in PyTorch; the case wants none", s.E-1, tok[s.E-1])
	}
	for _, mesh := range []string{"ep=4", "ep=2,tp=2", "dp=2,ep=2", "ep=3"} {
		t.Run(mesh, func(t *testing.T) {
			out := t.TempDir()
			code, stdout, errs := run(t, "moe", "--mesh", mesh, "--load", in, "--dump", out, "--aux-coef", fmt.Sprint(auxCoef))
			if code != 0 {
				t.Fatalf("exit %d: %s %s", code, stdout, errs)
			}
			var r MoEReport
			if err := json.Unmarshal([]byte(stdout), &r); err != nil {
				t.Fatalf("%v: %q", err, stdout)
			}
			if !r.PlanMatch || r.TokensPerExpert[s.E-1] != 0 {
				t.Errorf("report %+v", r)
			}
			for _, n := range []string{"y", "aux", "dx", "drouter", "dw1", "db1", "dw2", "db2"} {
				got, err := tensor.Load(filepath.Join(out, n+".npy"))
				if err != nil {
					t.Fatal(err)
				}
				w := want(n)
				if got.Len() != len(w) {
					t.Fatalf("%s: %d values, PyTorch %d", n, got.Len(), len(w))
				}
				var d, m float64
				for i, v := range w {
					d = max(d, math.Abs(float64(got.Float32()[i])-v))
					m = max(m, math.Abs(v))
				}
				if d > 1e-5*m {
					t.Errorf("%s: largest difference %.3g, %.3g of the largest value", n, d, d/m)
				}
			}
		})
	}
}

// TestMoEBadInput: each bad input is one line and exit 2, before any work.
func TestMoEBadInput(t *testing.T) {
	good := t.TempDir()
	s := spmd.MoEShape{T: 5, H: 4, F: 3, E: 3, K: 2}
	writeMoEInputs(t, good, s)
	nan := t.TempDir()
	writeMoEInputs(t, nan, s)
	x, _ := tensor.Load(filepath.Join(nan, "x.npy"))
	x.Float32()[2*s.H+1] = float32(math.NaN())
	x.Save(filepath.Join(nan, "x.npy"))
	shape := t.TempDir()
	writeMoEInputs(t, shape, s)
	tensor.New(tensor.Float32, s.E, s.H+1).Save(filepath.Join(shape, "router.npy"))
	w1 := t.TempDir()
	writeMoEInputs(t, w1, s)
	tensor.New(tensor.Float32, s.E, s.F, s.H+2).Save(filepath.Join(w1, "w1.npy"))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--experts", "2", "--top-k", "3"}, "--top-k 3 is more than --experts 2"},
		{[]string{"--top-k", "0"}, "--top-k 0"},
		{[]string{"--experts", "0"}, "--experts 0"},
		{[]string{"--mesh", "ep=2,xp=2"}, `"xp"`},
		{[]string{"--mesh", "ep=3"}, "mesh"},
		{[]string{"--capacity-factor", "-1"}, "--capacity-factor -1"},
		{[]string{"--dtype", "bfloat16"}, "float32"},
		{[]string{"--load", nan}, "token 2, expert 0: NaN"},
		{[]string{"--load", shape}, "router.npy has shape [3 5], want [3 4]"},
		{[]string{"--load", w1}, "w1.npy has shape [3 3 6], want [3 3 4]"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			code, out, errs := runEnv(t, map[string]string{"WORLD_SIZE": "2", EnvCheck: "1"}, append([]string{"moe"}, c.args...)...)
			if code != ExitUsage || out != "" || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
				t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", code, out, errs, c.want)
			}
		})
	}
	if code, out, errs := runEnv(t, map[string]string{"WORLD_SIZE": "2", EnvCheck: "1"}, "moe", "--load", good); code != 0 {
		t.Errorf("good input: exit %d, %q %q", code, out, errs)
	}
}

// TestMoEBackends runs the layer's two-phase all-to-alls on every collective
// backend: host (cpu tensors), staged (sim ranks sharing a device) and the
// nccl backend (sim ranks on separate devices, the fake library); the
// dumps agree with the host's.
func TestMoEBackends(t *testing.T) {
	in := t.TempDir()
	writeMoEInputs(t, in, spmd.MoEShape{T: 13, H: 8, F: 6, E: 5, K: 2})
	runDump := func(env map[string]string, device string) string {
		t.Helper()
		out := t.TempDir()
		code, stdout, errs := runEnv(t, env, "moe", "--mesh", "ep=2,tp=2", "--load", in, "--dump", out, "--device", device)
		if code != 0 {
			t.Fatalf("%v %s: exit %d: %s %s", env, device, code, stdout, errs)
		}
		return out
	}
	host := runDump(nil, "cpu")
	undo := sim.SeparateDevices()
	nccl := runDump(map[string]string{"MESHRUN_NCCL_LIBRARY": "fake", "MESHRUN_COLLECTIVES": "nccl"}, "sim")
	undo()
	staged := runDump(map[string]string{"MESHRUN_COLLECTIVES": "staged"}, "sim")
	for _, n := range []string{"y", "aux", "dx", "drouter", "dw1", "db1", "dw2", "db2"} {
		want, err := tensor.Load(filepath.Join(host, n+".npy"))
		if err != nil {
			t.Fatal(err)
		}
		for _, dir := range []string{staged, nccl} {
			got, err := tensor.Load(filepath.Join(dir, n+".npy"))
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range want.Float32() {
				if d := math.Abs(float64(got.Float32()[i] - v)); d > 1e-6*(1+math.Abs(float64(v))) {
					t.Fatalf("%s in %s: element %d is %v, the host backend's %v", n, dir, i, got.Float32()[i], v)
				}
			}
		}
	}
}
