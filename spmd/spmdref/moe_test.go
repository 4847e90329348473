package spmdref

import (
	"encoding/json"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/internal/pythontest"
	sim "github.com/meshrun/meshrun/placement/placementref"
	"github.com/meshrun/meshrun/tensor"
)

// moeCase is one layer's inputs.
type moeCase struct {
	name    string
	m       MoE
	x, dy   sim.Tensor
	p       MoEParams
	auxCoef float64
}

// newMoECase draws a layer of E experts at random. x's column 0 is 1 and
// the last expert's router weight there is -8, so no token picks it (its
// logit is about 8 below the others'); tie makes router rows 1 and 2 equal,
// so every token's probabilities of experts 1 and 2 tie exactly.
func newMoECase(name string, seed uint64, t, h, f, e int, m MoE, tie bool) moeCase {
	rng := rand.New(rand.NewPCG(seed, 17))
	draw := func(scale float64, shape ...int) sim.Tensor {
		s := sim.New(shape...)
		for i := range s.Data {
			s.Data[i] = scale * (2*rng.Float64() - 1)
		}
		return s
	}
	c := moeCase{name: name, m: m, auxCoef: 0.37,
		x: draw(1, t, h), dy: draw(1, t, h),
		p: MoEParams{Router: draw(0.8, e, h), W1: draw(0.5, e, f, h), B1: draw(0.3, e, f), W2: draw(0.5, e, h, f), B2: draw(0.3, e, h)}}
	for r := 0; r < t; r++ {
		c.x.Data[r*h] = 1
	}
	for r := 0; r < e; r++ {
		c.p.Router.Data[r*h] = 0
	}
	c.p.Router.Data[(e-1)*h] = -8
	if tie {
		copy(c.p.Router.Data[2*h:3*h], c.p.Router.Data[h:2*h])
	}
	return c
}

// moeTorchTol bounds every output's and gradient's difference from
// PyTorch's, relative to max(|value|, 1e-3·the largest |value| of that
// output): float64 sums in another order differ by a few ulps.
const moeTorchTol = 1e-10

// TestMoEMatchesPyTorch: the reference's forward (y, aux, the slots each
// expert kept, the dropped count) and every gradient against the same layer
// in PyTorch (testdata/torch_moe.py, float64, autograd), on T = 10 tokens
// and E = 6 experts with k = 2, the last expert receiving no token:
// dropless, at capacity factor 1 (slots dropped), and with two experts whose
// probabilities tie for every token (the lower index chosen: TestMoERouting).
func TestMoEMatchesPyTorch(t *testing.T) {
	py := pythontest.Python(t, "torch, numpy", "MESHRUN_REQUIRE_TORCH")
	worst := 0.0
	for _, c := range []moeCase{
		newMoECase("dropless", 1, 10, 8, 12, 6, MoE{K: 2}, false),
		newMoECase("capacity", 2, 10, 8, 12, 6, MoE{K: 2, Capacity: 1}, false),
		newMoECase("tie", 3, 14, 8, 12, 6, MoE{K: 2}, true),
	} {
		out, err := MoEForward(c.m, c.x, c.p)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		g, err := MoEBackward(c.m, c.x, c.p, c.dy, c.auxCoef)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		e := len(out.Tokens)
		if out.Routed[e-1] != 0 {
			t.Fatalf("%s: the last expert got %d slots, want none", c.name, out.Routed[e-1])
		}
		if c.name == "capacity" && out.Dropped == 0 {
			t.Fatalf("%s: no slot dropped (tokens %v, capacity %d)", c.name, out.Tokens, out.Cap)
		}
		dir := t.TempDir()
		for name, v := range map[string]sim.Tensor{"x": c.x, "dy": c.dy, "router": c.p.Router,
			"w1": c.p.W1, "b1": c.p.B1, "w2": c.p.W2, "b2": c.p.B2} {
			saveNpy(t, filepath.Join(dir, name+".npy"), v)
		}
		cfg, _ := json.Marshal(map[string]any{"T": c.x.Shape[0], "E": e, "k": c.m.K, "aux_coef": c.auxCoef, "capacity": c.m.Capacity})
		if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
			t.Fatal(err)
		}
		if msg, err := exec.Command(py, filepath.Join("testdata", "torch_moe.py"), dir).CombinedOutput(); err != nil {
			t.Fatalf("%s: %s: %v\n%s", c.name, py, err, msg)
		}
		tokens, dropped := make([]float64, e), []float64{float64(out.Dropped)}
		for i, n := range out.Tokens {
			tokens[i] = float64(n)
		}
		for _, o := range []struct {
			name string
			got  []float64
		}{
			{"y", out.Y.Data}, {"aux", []float64{out.Aux}}, {"tokens", tokens}, {"dropped", dropped},
			{"dx", g.DX.Data}, {"drouter", g.DRouter.Data}, {"dw1", g.DW1.Data}, {"db1", g.DB1.Data},
			{"dw2", g.DW2.Data}, {"db2", g.DB2.Data},
		} {
			want := loadNpy(t, filepath.Join(dir, o.name+".npy"))
			worst = max(worst, compare(t, c.name+" "+o.name, o.got, want, moeTorchTol))
		}
		t.Logf("%s: tokens per expert %v, dropped %d, aux %.6f", c.name, out.Tokens, out.Dropped, out.Aux)
	}
	t.Logf("every output and gradient within %.2g of PyTorch (relative)", worst)
}

// compare fails t where got and want differ by more than tol relative to
// max(|want_i|, 1e-3·max|want|), and returns the largest such difference.
func compare(t *testing.T, what string, got, want []float64, tol float64) float64 {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	top := 0.0
	for _, w := range want {
		top = max(top, math.Abs(w))
	}
	worst := 0.0
	for i := range got {
		d := math.Abs(got[i] - want[i])
		if d != 0 {
			d /= max(math.Abs(want[i]), 1e-3*top)
		}
		if !(d <= tol) {
			t.Fatalf("%s[%d] = %.17g, want %.17g (relative %.2g)", what, i, got[i], want[i], d)
		}
		worst = max(worst, d)
	}
	return worst
}

func saveNpy(t *testing.T, path string, v sim.Tensor) {
	t.Helper()
	x, err := tensor.FromFloat64(v.Data, v.Shape...)
	if err == nil {
		err = x.Save(path)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func loadNpy(t *testing.T, path string) []float64 {
	t.Helper()
	x, err := tensor.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if x.DType() != tensor.Float64 {
		t.Fatalf("%s: %v, want float64", path, x.DType())
	}
	return x.Float64()
}

// TestMoEIdleExpert: an expert no token reaches gets exactly zero weight
// and bias gradients, while its router row still gets the aux term's.
func TestMoEIdleExpert(t *testing.T) {
	for _, c := range []moeCase{
		newMoECase("dropless", 4, 7, 5, 6, 6, MoE{K: 2}, false),
		newMoECase("capacity", 5, 7, 5, 6, 6, MoE{K: 3, Capacity: 0.75}, false),
	} {
		g, err := MoEBackward(c.m, c.x, c.p, c.dy, c.auxCoef)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := MoEForward(c.m, c.x, c.p)
		if out.Routed[5] != 0 {
			t.Fatalf("%s: expert 5 got %d slots", c.name, out.Routed[5])
		}
		for _, w := range []sim.Tensor{g.DW1, g.DB1, g.DW2, g.DB2} {
			n := len(w.Data) / 6
			for i, v := range w.Data[5*n:] {
				if v != 0 {
					t.Fatalf("%s: a gradient of expert 5 [%d] = %g, want 0", c.name, i, v)
				}
			}
		}
		nonzero := false
		for _, v := range g.DRouter.Data[5*5 : 6*5] {
			nonzero = nonzero || v != 0
		}
		if !nonzero {
			t.Errorf("%s: the idle expert's router row has no gradient (aux and the softmax give it one)", c.name)
		}
	}
}

// TestMoETopOneIsTheExpert: with k = 1 each token's gate is 1, so y is its
// expert's output, computed here from the definition; with k = 2 every
// token's gates sum to 1.
func TestMoETopOneIsTheExpert(t *testing.T) {
	c := newMoECase("k=1", 6, 5, 4, 3, 3, MoE{K: 1}, false)
	out, err := MoEForward(c.m, c.x, c.p)
	if err != nil {
		t.Fatal(err)
	}
	const H, F = 4, 3
	for tok := 0; tok < 5; tok++ {
		e := out.Expert[tok]
		for i := 0; i < H; i++ {
			want := c.p.B2.Data[e*H+i]
			for f := 0; f < F; f++ {
				h := c.p.B1.Data[e*F+f]
				for j := 0; j < H; j++ {
					h += c.p.W1.Data[(e*F+f)*H+j] * c.x.Data[tok*H+j]
				}
				want += c.p.W2.Data[(e*H+i)*F+f] * UnaryF("gelu", h)
			}
			if got := out.Y.Data[tok*H+i]; math.Abs(got-want) > 1e-14*max(1, math.Abs(want)) {
				t.Fatalf("token %d: y[%d] = %.17g, expert %d gives %.17g", tok, i, got, e, want)
			}
		}
	}
	c = newMoECase("k=2", 7, 9, 4, 3, 6, MoE{K: 2}, false)
	out, err = MoEForward(c.m, c.x, c.p)
	if err != nil {
		t.Fatal(err)
	}
	for tok := 0; tok < 9; tok++ {
		if s := out.Gate[2*tok] + out.Gate[2*tok+1]; math.Abs(s-1) > 1e-15 {
			t.Fatalf("token %d: gates sum to %.17g", tok, s)
		}
	}
}

// TestMoERouting: the routing rules without PyTorch. Ties go to the lower
// expert; capacity is ceil(T·k·c / E) and each expert keeps its first slots
// in slot order; a token that lost a slot keeps its other gates as computed
// from all k choices (not renormalized over the kept ones).
func TestMoERouting(t *testing.T) {
	c := newMoECase("tie", 3, 14, 8, 12, 6, MoE{K: 2}, true)
	out, err := MoEForward(c.m, c.x, c.p)
	if err != nil {
		t.Fatal(err)
	}
	decided := 0
	for s, e := range out.Expert {
		other := out.Expert[s^1]
		if e == 2 && other != 1 {
			t.Fatalf("slot %d chose expert 2 over expert 1, whose probability is the same", s)
		}
		if e == 1 && other != 2 {
			decided++
		}
	}
	if decided == 0 {
		t.Fatal("no token where the tie decided the choice")
	}

	c = newMoECase("capacity", 2, 10, 8, 12, 6, MoE{K: 2, Capacity: 1}, false)
	out, err = MoEForward(c.m, c.x, c.p)
	if err != nil {
		t.Fatal(err)
	}
	if out.Cap != 4 { // ceil(10·2·1 / 6)
		t.Fatalf("capacity %d, want 4", out.Cap)
	}
	seen := make([]int, 6)
	lost := 0
	for s, e := range out.Expert {
		if want := seen[e] < out.Cap; out.Kept[s] != want {
			t.Fatalf("slot %d (expert %d, its slot %d): kept %v, want %v", s, e, seen[e], out.Kept[s], want)
		}
		seen[e]++
		tok := s / 2
		p := out.Probs.Data[tok*6 : tok*6+6]
		sum := p[out.Expert[2*tok]] + p[out.Expert[2*tok+1]]
		if g := p[e] / sum; out.Gate[s] != g {
			t.Fatalf("slot %d: gate %.17g, want %.17g (over both choices, kept or not)", s, out.Gate[s], g)
		}
		if !out.Kept[s^1] && out.Kept[s] {
			lost++
		}
	}
	if out.Dropped == 0 || lost == 0 || !slices.Equal(seen, out.Routed) {
		t.Fatalf("dropped %d, tokens with one slot lost %d, routed %v (counted %v)", out.Dropped, lost, out.Routed, seen)
	}
}

// TestMoEGradients: MoEBackward against central differences of Σ dy⊙y +
// auxCoef·aux on a tiny layer, dropless and with slots dropped, away from
// top-k ties (the drawn probabilities' k-th and next differ by 1e-3 at
// least, so no step of 1e-6 changes the routing).
func TestMoEGradients(t *testing.T) {
	for _, c := range []moeCase{
		newMoECase("dropless", 8, 5, 3, 4, 4, MoE{K: 2}, false),
		newMoECase("capacity", 9, 5, 3, 4, 4, MoE{K: 2, Capacity: 0.8}, false),
	} {
		out, err := MoEForward(c.m, c.x, c.p)
		if err != nil {
			t.Fatal(err)
		}
		if c.m.Capacity > 0 && out.Dropped == 0 {
			t.Fatalf("%s: nothing dropped", c.name)
		}
		E := len(out.Tokens)
		for tok := 0; tok < c.x.Shape[0]; tok++ {
			p := append([]float64(nil), out.Probs.Data[tok*E:(tok+1)*E]...)
			kth := p[out.Expert[tok*2+1]]
			for e, v := range p {
				if e != out.Expert[tok*2] && e != out.Expert[tok*2+1] && kth-v < 1e-3 {
					t.Fatalf("%s: token %d: probabilities %v near a tie", c.name, tok, p)
				}
			}
		}
		g, err := MoEBackward(c.m, c.x, c.p, c.dy, c.auxCoef)
		if err != nil {
			t.Fatal(err)
		}
		objective := func() float64 {
			o, err := MoEForward(c.m, c.x, c.p)
			if err != nil {
				t.Fatal(err)
			}
			return dot(c.dy.Data, o.Y.Data) + c.auxCoef*o.Aux
		}
		for _, v := range []struct {
			name    string
			in, grd sim.Tensor
		}{{"x", c.x, g.DX}, {"router", c.p.Router, g.DRouter}, {"w1", c.p.W1, g.DW1}, {"b1", c.p.B1, g.DB1},
			{"w2", c.p.W2, g.DW2}, {"b2", c.p.B2, g.DB2}} {
			const step = 1e-6
			for i := range v.in.Data {
				keep := v.in.Data[i]
				v.in.Data[i] = keep + step
				up := objective()
				v.in.Data[i] = keep - step
				down := objective()
				v.in.Data[i] = keep
				num := (up - down) / (2 * step)
				if d := math.Abs(num - v.grd.Data[i]); d > 1e-7*max(1, math.Abs(num)) {
					t.Fatalf("%s: d%s[%d] = %.12g, central differences give %.12g", c.name, v.name, i, v.grd.Data[i], num)
				}
			}
		}
	}
}

// TestMoEErrors: bad shapes, k outside 1..E, no expert, a bad capacity
// factor and NaN logits fail with the reference's sentinels; no token does
// not.
func TestMoEErrors(t *testing.T) {
	c := newMoECase("ok", 10, 4, 3, 2, 3, MoE{K: 2}, false)
	bad := func(f func(*moeCase)) moeCase {
		d := newMoECase("bad", 10, 4, 3, 2, 3, MoE{K: 2}, false)
		f(&d)
		return d
	}
	for _, tc := range []struct {
		name string
		c    moeCase
		is   error
	}{
		{"w1 of another hidden size", bad(func(d *moeCase) { d.p.W1 = sim.New(3, 2, 4) }), ErrMoEShape},
		{"b2 of too few experts", bad(func(d *moeCase) { d.p.B2 = sim.New(2, 3) }), ErrMoEShape},
		{"x of one dim", bad(func(d *moeCase) { d.x = sim.New(12) }), ErrMoEShape},
		{"data short of the shape", bad(func(d *moeCase) { d.x.Data = d.x.Data[:5] }), ErrMoEShape},
		{"dy of another shape", bad(func(d *moeCase) { d.dy = sim.New(4, 2) }), ErrMoEShape},
		{"k > E", bad(func(d *moeCase) { d.m.K = 4 }), ErrMoERouting},
		{"k = 0", bad(func(d *moeCase) { d.m.K = 0 }), ErrMoERouting},
		{"E = 0", bad(func(d *moeCase) {
			d.p = MoEParams{Router: sim.New(0, 3), W1: sim.New(0, 2, 3), B1: sim.New(0, 2), W2: sim.New(0, 3, 2), B2: sim.New(0, 3)}
		}), ErrMoERouting},
		{"negative capacity", bad(func(d *moeCase) { d.m.Capacity = -1 }), ErrMoERouting},
		{"NaN capacity", bad(func(d *moeCase) { d.m.Capacity = math.NaN() }), ErrMoERouting},
		{"NaN logit", bad(func(d *moeCase) { d.x.Data[7] = math.NaN() }), ErrMoELogits},
		{"infinite logit", bad(func(d *moeCase) { d.p.Router.Data[4] = math.Inf(1) }), ErrMoELogits},
	} {
		_, ferr := MoEForward(tc.c.m, tc.c.x, tc.c.p)
		_, berr := MoEBackward(tc.c.m, tc.c.x, tc.c.p, tc.c.dy, 0.1)
		for i, err := range []error{ferr, berr} {
			if tc.name == "dy of another shape" && i == 0 {
				continue
			}
			if !errors.Is(err, tc.is) {
				t.Errorf("%s: %v, want %v", tc.name, err, tc.is)
				continue
			}
			if msg := err.Error(); !strings.HasPrefix(msg, tc.is.Error()) || strings.Count(msg, "spmdref: ") != 1 {
				t.Errorf("%s: %q: want it to start with %q and name spmdref once", tc.name, msg, tc.is)
			}
		}
	}
	if _, err := MoEBackward(c.m, c.x, c.p, c.dy, 0.1); err != nil {
		t.Fatal(err)
	}
	// No token is no error: y is empty and aux is 0.
	out, err := MoEForward(c.m, sim.New(0, 3), c.p)
	if _, berr := MoEBackward(c.m, sim.New(0, 3), c.p, sim.New(0, 3), 0.1); err != nil || berr != nil || out.Aux != 0 || len(out.Y.Data) != 0 {
		t.Errorf("no token: aux %g, y %v, errors %v, %v", out.Aux, out.Y.Shape, err, berr)
	}
}
