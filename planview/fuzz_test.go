package planview

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/internal/testtime"
)

// fuzzMaxAlloc bounds what planning one command line may allocate.
const fuzzMaxAlloc = 64 << 20

// FuzzPlanFlags runs `launcher plan` with fuzzed arguments: whatever they
// are, no panic, no more than 64 MiB allocated for one command line, and plan
// exits 0 or 2. args holds the arguments, one per line.
func FuzzPlanFlags(f *testing.F) {
	for _, args := range [][]string{
		{"--mesh", "dp=2,tp=2", "--op", "linear", "--x", "8x16:[S(0),R]", "--w", "32x16:[R,S(0)]", "--b", "32:[R,S(0)]", "--json"},
		{"--mesh", "4", "--op", "matmul", "--a", "8x16:[S(0)]", "--b", "16x4:[R]", "--grads", "a", "--dtype", "bfloat16"},
		{"--mesh", "2x2", "--op", "sum", "--x", "8x16:[P,S(1)]", "--dims", "0,1", "--out", "[R,R]", "--world", "4"},
		{"--mesh", "tp=3", "--block", "mlp", "--tokens", "13", "--hidden", "8", "--ffn", "22", "--sequence-parallel"},
		{"--mesh", "1000000x1000000", "--op", "linear", "--x", "8x16:[R,R]", "--w", "32x16:[R,R]"},
		{"--block", "mlp", "--mesh", "tp=2", "--tokens", "4000000000", "--hidden", "1000000000", "--ffn", "1000000000"},
		{"--mesh", "2x2x2", "--op", "gelu", "--x", "2x3x4:[S(0),S(1),S(2,chunk)]"},
		{"--mesh", "2x1x2x1x2x1x1x1", "--block", "mlp"},
		{"--block", "transformer", "--mesh", "pp=4,tp=2", "--micro-batches", "1024", "--schedule", "zb", "--pp-layers", "1,2,3,4"},
		{"--mesh", "2x2x2", "--x", "2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x16:[S(0),S(1),S(2)]", "--w", "32x16:[R,R,S(0)]"},
	} {
		f.Add(strings.Join(args, "\n"))
	}
	f.Fuzz(func(t *testing.T, args string) {
		var argv []string
		if args != "" {
			argv = strings.Split(args, "\n")
		}
		var before, after runtime.MemStats
		var out, errb bytes.Buffer
		runtime.ReadMemStats(&before)
		start := time.Now()
		code := Main(context.Background(), argv, &out, &errb)
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > fuzzMaxAlloc {
			t.Fatalf("plan %q allocated %d MiB; stderr %q", argv, n>>20, errb.String())
		}
		if code != 0 && code != ExitUsage {
			t.Fatalf("plan %q: exit %d; stderr %q", argv, code, errb.String())
		}
		if d := time.Since(start); d > testtime.Scale(10*time.Second) {
			t.Fatalf("%q took %v", argv, d)
		}
	})
}
