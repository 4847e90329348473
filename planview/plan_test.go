package planview

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/spmd/spmdtest"
)

func TestPlanJSON(t *testing.T) {
	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"--mesh", "dp=2,tp=2", "--op", "linear",
		"--x", "8x16:[S(0),R]", "--w", "32x16:[R,S(0)]", "--b", "32:[R,S(0)]", "--json", "--model", spmdtest.LargeLayersFile(t)}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var r struct {
		Op   string `json:"op"`
		Mesh struct {
			Shape []int    `json:"shape"`
			Names []string `json:"names"`
		} `json:"mesh"`
		Inputs  map[string]struct{ Placements []string } `json:"inputs"`
		Forward struct {
			Output struct {
				Tensor     string   `json:"tensor"`
				Shape      []int    `json:"shape"`
				Placements []string `json:"placements"`
			} `json:"output"`
			Collectives []json.RawMessage `json:"collectives"`
		} `json:"forward"`
		Backward struct {
			Grads       map[string]struct{ Placements []string } `json:"grads"`
			Collectives []struct {
				Kind     string `json:"kind"`
				Tensor   string `json:"tensor"`
				MeshDims []int  `json:"mesh_dims"`
				Bytes    int64  `json:"bytes"`
			} `json:"collectives"`
		} `json:"backward"`
		CommBytes struct{ Forward, Backward int64 } `json:"comm_bytes"`
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if r.Op != "linear" || r.Mesh.Names[1] != "tp" || r.Forward.Output.Tensor != "y" ||
		strings.Join(r.Forward.Output.Placements, ",") != "S(0),S(1)" || len(r.Forward.Collectives) != 0 {
		t.Fatalf("unexpected forward: %s", out.String())
	}
	if !strings.HasPrefix(out.String(), `{"op":"linear","mesh":{"shape":[2,2],"names":["dp","tp"]},"inputs":{"x":`) {
		t.Fatalf("keys out of order: %s", out.String())
	}
	c := r.Backward.Collectives[0]
	if c.Kind != "all_reduce" || c.Tensor != "dx" || len(c.MeshDims) != 1 || c.MeshDims[0] != 1 || c.Bytes != 4*4*16 {
		t.Fatalf("first backward collective %+v", c)
	}
	var sum int64
	for _, c := range r.Backward.Collectives {
		sum += c.Bytes
	}
	if sum != r.CommBytes.Backward {
		t.Fatalf("comm_bytes.backward %d, collectives sum to %d", r.CommBytes.Backward, sum)
	}
}

func TestPlanErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad flag", []string{"--mesh", "4", "--bogus"}, "bogus"},
		{"no mesh", []string{"--x", "8x16:[R]"}, "--mesh is required"},
		{"bad mesh", []string{"--mesh", "dp=0"}, "--mesh"},
		{"shape does not fit", []string{"--mesh", "4", "--x", "8x16:[R]", "--w", "32x15:[R]"}, "shape mismatch"},
		{"placements do not match the mesh", []string{"--mesh", "dp=2,tp=2", "--x", "8x16:[R]", "--w", "32x16:[R,R]"}, "placements for the 2-D mesh"},
		{"mesh does not match world", []string{"--mesh", "dp=2,tp=2", "--world", "3", "--x", "8x16:[R,R]", "--w", "32x16:[R,R]"}, "world size is 3"},
		{"unknown placement", []string{"--mesh", "4", "--x", "8x16:[Q]", "--w", "32x16:[R]"}, `"Q"`},
		{"unknown op", []string{"--mesh", "4", "--op", "conv"}, "conv"},
		{"unknown grad", []string{"--mesh", "4", "--x", "8x16:[R]", "--w", "32x16:[R]", "--grads", "q"}, `no input "q"`},
		{"input the op lacks", []string{"--mesh", "4", "--op", "gelu", "--x", "8x16:[R]", "--w", "32x16:[R]"}, "--w: gelu takes --x"},
		{"shard beyond the tensor", []string{"--mesh", "4", "--x", "8x16:[S(2)]", "--w", "32x16:[R]"}, "tensor dim 2"},
		{"unknown dtype", []string{"--mesh", "4", "--x", "8x16:[R]", "--w", "32x16:[R]", "--dtype", "fp8"}, `--dtype "fp8"`},
		{"redistribute S -> P", []string{"--mesh", "4", "--op", "redistribute", "--x", "8x16:[S(0)]", "--out", "[P]"}, "no redistribution path"},
		{"redistribute without --out", []string{"--mesh", "4", "--op", "redistribute", "--x", "8x16:[S(0)]"}, "--out is required"},
		{"redistribute without --x", []string{"--mesh", "4", "--op", "redistribute", "--out", "[R]"}, "--x is required"},
		{"redistribute with --w", []string{"--mesh", "4", "--op", "redistribute", "--x", "8x16:[R]", "--w", "8x16:[R]", "--out", "[R]"}, "--w: redistribute takes --x"},
		{"redistribute with --grads", []string{"--mesh", "4", "--op", "redistribute", "--x", "8x16:[R]", "--out", "[R]", "--grads", "x"}, "--grads, --dims and --explain are for ops"},
		{"redistribute to a bad layout", []string{"--mesh", "4", "--op", "redistribute", "--x", "8x16:[R]", "--out", "[S(2)]"}, "--out [S(2)]"},
		{"explain a block", []string{"--mesh", "4", "--block", "mlp", "--explain", "2"}, "--explain is for one op"},
		{"negative explain", []string{"--mesh", "4", "--x", "8x16:[R]", "--w", "32x16:[R]", "--explain", "-1"}, "--explain -1"},
		{"unknown dtype, block", []string{"--mesh", "4", "--block", "mlp", "--dtype", "int8"}, `--dtype "int8"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := Main(context.Background(), tc.args, &out, &errb)
			msg := errb.String()
			if code != ExitUsage || out.Len() != 0 || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", code, out.String(), msg, tc.want)
			}
		})
	}
}

// TestPlanDType: bytes are counted in the element type asked for.
func TestPlanDType(t *testing.T) {
	for _, tc := range []struct {
		dtype string
		bytes string
	}{{"float32", "4-byte elements"}, {"bfloat16", "2-byte elements"}, {"float64", "8-byte elements"}} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), []string{"--mesh", "4", "--x", "8x16:[S(1)]", "--w", "32x16:[S(1)]", "--dtype", tc.dtype}, &out, &errb)
		if code != 0 || !strings.Contains(out.String(), tc.bytes) {
			t.Fatalf("%s: exit %d %s%s", tc.dtype, code, out.String(), errb.String())
		}
	}
	var f32, bf16 bytes.Buffer
	for _, c := range []struct {
		dt  string
		out *bytes.Buffer
	}{{"float32", &f32}, {"bfloat16", &bf16}} {
		if code := Main(context.Background(), []string{"--mesh", "tp=2", "--block", "mlp", "--dtype", c.dt}, c.out, &bytes.Buffer{}); code != 0 {
			t.Fatalf("block %s: exit %d", c.dt, code)
		}
	}
	if !strings.Contains(f32.String(), "(8192 B)") || !strings.Contains(bf16.String(), "(4096 B)") {
		t.Fatalf("block bytes: float32\n%s\nbfloat16\n%s", f32.String(), bf16.String())
	}
}

// TestPlanExplainJSON: --explain adds the chosen strategy and its runners-up,
// cheapest first, with their costs in bytes, to the JSON; without it the key
// is absent.
func TestPlanExplainJSON(t *testing.T) {
	args := []string{"--mesh", "dp=2,tp=2", "--op", "linear", "--x", "8x16:[S(0),R]", "--w", "32x16:[R,S(0)]", "--b", "32:[R,S(0)]", "--json",
		"--model", spmdtest.LargeLayersFile(t)}
	var out, errb bytes.Buffer
	if code := Main(context.Background(), append(args, "--explain", "2"), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	type cand struct {
		Strategy    []string `json:"strategy"`
		Output      []string `json:"output"`
		SentBytes   int64    `json:"sent_bytes"`
		Collectives int      `json:"collectives"`
		Modelled    struct {
			Total float64 `json:"total_s"`
		} `json:"modelled"`
	}
	var r struct {
		Explain *struct {
			Chosen    cand   `json:"chosen"`
			RunnersUp []cand `json:"runners_up"`
		} `json:"explain"`
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	e := r.Explain
	if e == nil || len(e.RunnersUp) != 2 || strings.Join(e.Chosen.Strategy, "; ") != "dp: split output dim 0; tp: split output dim 1" ||
		e.Chosen.Modelled.Total <= 0 || e.RunnersUp[0].Modelled.Total < e.Chosen.Modelled.Total || e.RunnersUp[1].Modelled.Total < e.RunnersUp[0].Modelled.Total {
		t.Fatalf("explain: %s", out.String())
	}
	out.Reset()
	if code := Main(context.Background(), args, &out, &errb); code != 0 || strings.Contains(out.String(), "explain") {
		t.Fatalf("without --explain: exit %d, %s", code, out.String())
	}
}
