package launch

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/meshrun/meshrun/internal/testtime"
)

// fuzzMaxAlloc bounds what parsing and checking one command line may allocate.
const fuzzMaxAlloc = 64 << 20

// FuzzRunFlags parses and validates fuzzed `launcher run` flags
// (ParseRunFlags, Validate: nothing starts): whatever they are, no panic and
// no more than 64 MiB allocated for one command line. args holds the
// arguments, one per line. (planview's FuzzPlanFlags fuzzes `launcher plan`.)
func FuzzRunFlags(f *testing.F) {
	for _, args := range [][]string{
		{"-n", "2", "mlp", "--tokens", "64"},
		{"--nproc-per-node", "4", "--device", "sim", "--kernels", "cpu", "--dtype", "bfloat16", "linear", "--mesh", "4"},
		{"-n", "2", "--console", "0,2-3", "--hang-after", "30s", "--grace", "2s", "--timeout", "10m", "--trace-max", "64MiB", "hello"},
		{"--nnodes", "2", "--node-rank", "1", "--nats", "nats://127.0.0.1:4222", "--nats-creds", "job.creds", "--job-id", "j1", "barrier"},
		{"--nnodes=1:2", "--max-restarts", "3", "--standalone", "--nproc_per_node=2", "--", "python", "train.py"},
		{"--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29500", "--redirects", "3", "--tee", "1", "--local-ranks-filter", "0", "mlp"},
		{"--log-dir", "runs", "--dry-run", "--share-gpus", "--oversubscribe", "-n", "cpu", "verify"},
		{"-n", "2", "mlp", "--tokens", "1000000000", "--hidden", "1000000000"},
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
		if d := time.Since(start); d > testtime.Scale(10*time.Second) {
			t.Fatalf("%q took %v", argv, d)
		}
	})
}
