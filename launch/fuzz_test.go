package launch

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/internal/testtime"
)

// fuzzMaxAlloc bounds what parsing and checking one command line may allocate.
const fuzzMaxAlloc = 64 << 20

// FuzzRunFlags parses and validates fuzzed `launcher run` flags
// (ParseRunFlags, Validate: nothing starts) and runs `launcher plan` with the
// same arguments: whatever they are, no panic, no more than 64 MiB allocated
// for one command line, and plan exits 0 or 2. args holds the arguments, one
// per line.
func FuzzRunFlags(f *testing.F) {
	for _, args := range [][]string{
		// launcher run
		{"-n", "2", "mlp", "--tokens", "64"},
		{"--nproc-per-node", "4", "--device", "sim", "--kernels", "cpu", "--dtype", "bfloat16", "linear", "--mesh", "4"},
		{"-n", "2", "--console", "0,2-3", "--hang-after", "30s", "--grace", "2s", "--timeout", "10m", "--trace-max", "64MiB", "hello"},
		{"--nnodes", "2", "--node-rank", "1", "--nats", "nats://127.0.0.1:4222", "--nats-creds", "job.creds", "--job-id", "j1", "barrier"},
		{"--nnodes=1:2", "--max-restarts", "3", "--standalone", "--nproc_per_node=2", "--", "python", "train.py"},
		{"--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29500", "--redirects", "3", "--tee", "1", "--local-ranks-filter", "0", "mlp"},
		{"--log-dir", "runs", "--dry-run", "--share-gpus", "--oversubscribe", "-n", "cpu", "verify"},
		{"-n", "2", "mlp", "--tokens", "1000000000", "--hidden", "1000000000"},
		// launcher plan
		{"--mesh", "dp=2,tp=2", "--op", "linear", "--x", "8x16:[S(0),R]", "--w", "32x16:[R,S(0)]", "--b", "32:[R,S(0)]", "--json"},
		{"--mesh", "4", "--op", "matmul", "--a", "8x16:[S(0)]", "--b", "16x4:[R]", "--grads", "a", "--dtype", "bfloat16"},
		{"--mesh", "2x2", "--op", "sum", "--x", "8x16:[P,S(1)]", "--dims", "0,1", "--out", "[R,R]", "--world", "4"},
		{"--mesh", "tp=3", "--block", "mlp", "--tokens", "13", "--hidden", "8", "--ffn", "22", "--sequence-parallel"},
		{"--mesh", "1000000x1000000", "--op", "linear", "--x", "8x16:[R,R]", "--w", "32x16:[R,R]"},
		{"--block", "mlp", "--mesh", "tp=2", "--tokens", "4000000000", "--hidden", "1000000000", "--ffn", "1000000000"},
		{"--mesh", "2x2x2", "--op", "gelu", "--x", "2x3x4:[S(0),S(1),S(2,chunk)]"},
		{"--mesh", "2x1x2x1x2x1x1x1", "--block", "mlp"},
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
		runtime.ReadMemStats(&before)
		start := time.Now()
		if o, err := ParseRunFlags(argv, nil); err == nil {
			_ = o.Validate()
		}
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > fuzzMaxAlloc {
			t.Fatalf("run %q: parsing and checking allocated %d MiB", argv, n>>20)
		}
		var out, errb bytes.Buffer
		runtime.ReadMemStats(&before)
		code := Main(context.Background(), append([]string{"plan"}, argv...), &out, &errb)
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
