package planview

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/internal/goldenfile"
)

// golden compares got with the file at path, or rewrites the file with -update.
var golden = goldenfile.Check

// TestPlanBlockGolden pins `launcher plan --block mlp` (the layout comes from
// package linear/layout, which the mlp workload runs): 1-D and 2-D meshes,
// with and without sequence parallel, uneven sizes.
func TestPlanBlockGolden(t *testing.T) {
	for _, tc := range []struct{ file, args string }{
		{"tp2.txt", "--mesh tp=2"},
		{"tp3-sp-uneven.txt", "--mesh tp=3 --sequence-parallel --tokens 13 --hidden 8 --ffn 22"},
		{"dp2-tp2.txt", "--mesh dp=2,tp=2 --tokens 4096 --hidden 1024 --ffn 4096"},
		{"dp2-tp2-sp-bf16.txt", "--mesh dp=2,tp=2 --sequence-parallel --tokens 4096 --hidden 1024 --ffn 4096 --dtype bfloat16"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := append([]string{"--block", "mlp"}, strings.Fields(tc.args)...)
			if code := Main(context.Background(), args, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			golden(t, filepath.Join("testdata", "block", tc.file), "$ launcher plan "+strings.Join(args, " ")+"\n"+out.String())
		})
	}
}

// TestPlanTransformerBlock: `launcher plan --block transformer` shows
// Megatron's collectives per block at realistic sizes (2 all-reduces
// forward and 2 backward; sequence parallel, 2 all-gathers and 2
// reduce-scatters forward, the same backward besides the layer norms'
// parameter gradients), pinned as goldens; --json carries the same totals
// for both blocks.
func TestPlanTransformerBlock(t *testing.T) {
	for _, tc := range []struct{ file, args, fwd, bwd string }{
		{"transformer-tp4.txt", "--mesh tp=4 --tokens 2048 --context 1024 --hidden 1024 --heads 16 --ffn 4096",
			"forward: 2 all_reduce on tp", "backward: 2 all_reduce on tp"},
		{"transformer-tp2-sp.txt", "--mesh tp=2 --tokens 2048 --context 1024 --hidden 1024 --heads 16 --ffn 4096 --sequence-parallel",
			"forward: 2 all_gather on tp (8388608 B), 2 reduce_scatter on tp", "backward: 4 all_reduce on tp (16384 B), 2 reduce_scatter on tp (16777216 B), 2 all_gather on tp"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := append([]string{"--block", "transformer"}, strings.Fields(tc.args)...)
			if code := Main(context.Background(), args, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			for _, want := range []string{tc.fwd, tc.bwd} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("no %q in the totals:\n%s", want, out.String()[max(0, out.Len()-400):])
				}
			}
			golden(t, filepath.Join("testdata", "block", tc.file), "$ launcher plan "+strings.Join(args, " ")+"\n"+out.String())
		})
	}
	for _, block := range []string{"mlp", "transformer"} {
		var out, errb bytes.Buffer
		args := []string{"--block", block, "--mesh", "tp=2", "--json"}
		if code := Main(context.Background(), args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, errb.String())
		}
		var r struct {
			Block       string
			Ops         []struct{ Name string }
			Collectives map[string][]struct {
				Kind  string
				Count int
			}
		}
		if err := json.Unmarshal(out.Bytes(), &r); err != nil || r.Block != block || len(r.Ops) < 3 || len(r.Collectives["forward"]) == 0 {
			t.Errorf("%v: %v\n%s", args, err, out.String())
		}
	}
	var out, errb bytes.Buffer
	if code := Main(context.Background(), []string{"--block", "transformer", "--mesh", "tp=3", "--heads", "4"}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "heads") {
		t.Errorf("4 heads on tp=3: exit %d, %s", code, errb.String())
	}
}

// TestPlanTransformerContextParallel: `launcher plan --block transformer`
// on a mesh with cp runs attention as a ring over cp at a long context (its
// send_recv bytes per rank: (cp−1)·(|K|+|V|) forward, (cp−1)·(|K|+|V|) +
// cp·(|dK|+|dV|) backward), the linear layers token-wise with their weight
// gradients all-reduced over cp; at a short context the planner gathers
// the keys instead, and says so. --json carries the ring. A cp dim on a
// block without a sequence, and a context shorter than 2·cp (zigzag), are
// refused with one line.
func TestPlanTransformerContextParallel(t *testing.T) {
	// K_loc: 8192/2 positions × 8 heads × 64 × 4 B = 8 MiB.
	const blk = 8 << 20
	for _, tc := range []struct{ file, args, want string }{
		{"transformer-cp2-tp2.txt", "--mesh cp=2,tp=2 --tokens 8192 --context 8192 --hidden 1024 --heads 16 --ffn 4096",
			fmt.Sprintf("forward: 2 send_recv on cp (%d B), 2 all_reduce on tp", 2*blk)},
		// Sequence parallel composes: the ring over cp, the tokens' rows
		// over tp gathered and reduce-scattered around the linear layers.
		{"transformer-cp2-tp2-sp.txt", "--mesh cp=2,tp=2 --tokens 8192 --context 8192 --hidden 1024 --heads 16 --ffn 4096 --sequence-parallel",
			fmt.Sprintf("2 send_recv on cp (%d B), 1 all_to_all on tp", 2*blk)},
		{"transformer-cp2-tp2-short.txt", "--mesh cp=2,tp=2 --tokens 8192 --context 64 --hidden 1024 --heads 16 --ffn 4096",
			"forward: 2 all_gather on cp (16777216 B), 2 all_reduce on tp"},
		// Tiny: the model prefers gathering rows to reducing weight
		// gradients in the linear layers too.
		{"transformer-cp4-tiny.txt", "--mesh cp=4 --tokens 64 --context 32 --hidden 64 --heads 4 --ffn 128",
			"cp: split the queries' sequence, gather the keys and values"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := append([]string{"--block", "transformer"}, strings.Fields(tc.args)...)
			if code := Main(context.Background(), args, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("no %q in:\n%s", tc.want, out.String())
			}
			golden(t, filepath.Join("testdata", "block", tc.file), "$ launcher plan "+strings.Join(args, " ")+"\n"+out.String())
		})
	}
	var out, errb bytes.Buffer
	args := strings.Fields("--block transformer --mesh cp=2,tp=2 --tokens 8192 --context 8192 --hidden 1024 --heads 16 --ffn 4096 --json")
	if code := Main(context.Background(), args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var r struct {
		Ops []struct {
			Name string
			Plan struct {
				Ring *struct {
					MeshDim       string `json:"mesh_dim"`
					Zigzag        bool
					ForwardBytes  int64 `json:"forward_bytes_per_rank"`
					BackwardBytes int64 `json:"backward_bytes_per_rank"`
				}
			}
		}
		Collectives map[string][]struct {
			Kind     string
			MeshDims []string `json:"mesh_dims"`
			Count    int
			Bytes    int64
		}
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	ring := r.Ops[2].Plan.Ring
	if r.Ops[2].Name != "attention" || ring == nil || ring.MeshDim != "cp" || !ring.Zigzag || ring.ForwardBytes != 2*blk || ring.BackwardBytes != 2*blk+4*blk {
		t.Errorf("attention's ring: %+v", ring)
	}
	for phase, want := range map[string][2]int64{"forward": {2, 2 * blk}, "backward": {6, 6 * blk}} {
		found := false
		for _, c := range r.Collectives[phase] {
			if c.Kind == "send_recv" {
				found = c.Count == int(want[0]) && c.Bytes == want[1] && len(c.MeshDims) == 1 && c.MeshDims[0] == "cp"
			}
		}
		if !found {
			t.Errorf("%s: no send_recv on cp, %d steps, %d B: %+v", phase, want[0], want[1], r.Collectives[phase])
		}
	}
	for _, bad := range []string{"--block mlp --mesh cp=2", "--block moe --mesh cp=2,ep=2", "--block transformer --mesh cp=4 --tokens 64 --context 6 --heads 2 --hidden 8 --ffn 8"} {
		var out, errb bytes.Buffer
		if code := Main(context.Background(), strings.Fields(bad), &out, &errb); code != 2 || out.Len() > 0 || strings.Count(errb.String(), "\n") != 1 ||
			!strings.Contains(errb.String(), "cp") {
			t.Errorf("%s: exit %d, %q %q", bad, code, out.String(), errb.String())
		}
	}
}

// TestPlanRedistributeGolden pins `launcher plan --op redistribute`: gathers
// of uneven shards, all-to-all on a 2-D mesh, reduce-scatter in bfloat16, a
// flattened all-reduce on a 3-D mesh, local-only steps, no steps, and --json.
func TestPlanRedistributeGolden(t *testing.T) {
	for _, tc := range []struct{ file, args string }{
		{"tp4-gather-uneven.txt", "--mesh tp=4 --x 10x6:[S(0)] --out [R]"},
		{"dp2-tp2-all-to-all.txt", "--mesh dp=2,tp=2 --x 8x16:[S(0),S(1)] --out [S(1),S(0)]"},
		{"dp2-tp2-slice-then-gather.txt", "--mesh dp=2,tp=2 --x 8x16:[S(0),R] --out [R,S(1)]"},
		{"tp3-reduce-scatter-bf16.txt", "--mesh tp=3 --x 7x5:[P] --out [S(0)] --dtype bfloat16"},
		{"2x2x2-flattened.txt", "--mesh 2x2x2 --x 16x8:[S(0),S(0),S(1)] --out [R,R,S(1)]"},
		{"tp2-owner-avg.txt", "--mesh tp=2 --x 4x4:[R] --out [P(avg)]"},
		{"tp2-same.txt", "--mesh tp=2 --x 4x4:[S(1)] --out [S(1)]"},
		{"dp2-tp2-json.txt", "--mesh dp=2,tp=2 --x 8x16:[S(0),S(1)] --out [S(1),S(0)] --json"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := append([]string{"--op", "redistribute"}, strings.Fields(tc.args)...)
			if code := Main(context.Background(), args, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			golden(t, filepath.Join("testdata", "redistribute", tc.file), "$ launcher plan "+strings.Join(args, " ")+"\n"+out.String())
		})
	}
}

// TestPlanMoEBlock pins `launcher plan --block moe`: the layouts and one
// step's collectives with their bytes, balanced and worst, on meshes of the
// dims ep, tp and dp (uneven experts on ep=3, capacity bounding the worst
// case), checks the worst case's bytes by hand on one, and refuses a mesh
// dim the layer does not know and k > E with one line each.
func TestPlanMoEBlock(t *testing.T) {
	for _, tc := range []struct{ file, args, want string }{
		// ep=2: rank 0 holds 2048 tokens; all 4096 slots of the other rank
		// to its experts: 4096·1024·4 B = 16 MiB; balanced, half of its own
		// 4096 slots leave: 8 MiB.
		{"moe-ep2-tp2.txt", "--mesh ep=2,tp=2 --tokens 4096 --hidden 1024 --ffn 4096 --experts 8 --top-k 2",
			"forward   dispatch  all_to_all  x           ep                8.0 MiB       16.0 MiB"},
		{"moe-dp2-ep3-capacity.txt", "--mesh dp=2,ep=3 --tokens 13 --hidden 8 --ffn 6 --experts 6 --top-k 2 --capacity-factor 1",
			"capacity 5 slots per expert"},
		{"moe-ep4-json.txt", "--mesh ep=4 --tokens 64 --hidden 16 --ffn 32 --experts 6 --top-k 2 --json", `"capacity_per_expert":0`},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var out, errb bytes.Buffer
			args := append([]string{"--block", "moe"}, strings.Fields(tc.args)...)
			if code := Main(context.Background(), args, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("no %q in:\n%s", tc.want, out.String())
			}
			golden(t, filepath.Join("testdata", "block", tc.file), "$ launcher plan "+strings.Join(args, " ")+"\n"+out.String())
		})
	}
	for _, bad := range [][]string{{"--mesh", "ep=2,zz=2"}, {"--mesh", "ep=2", "--experts", "2", "--top-k", "3"}, {"--mesh", "ep=2", "--experts", "0"}} {
		var out, errb bytes.Buffer
		if code := Main(context.Background(), append([]string{"--block", "moe"}, bad...), &out, &errb); code != 2 || out.Len() > 0 || strings.Count(errb.String(), "\n") != 1 {
			t.Errorf("%v: exit %d, %q %q", bad, code, out.String(), errb.String())
		}
	}
}
