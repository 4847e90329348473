package job

import (
	"bytes"
	"context"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fuzzMaxAlloc bounds what checking one command line may allocate (planning
// the MLP block on 2x1x2x1x2x1x1x1, whose strategy search plans some
// hundreds of redistributions, allocates about 70 MiB).
const fuzzMaxAlloc = 128 << 20

// workloadNames lists the workloads, sorted: a fuzzed byte picks one.
func workloadNames() []string {
	var names []string
	for n := range workloads {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// FuzzWorkloadFlags checks fuzzed command lines of every workload as the
// launcher's check does (MESHRUN_CHECK=1, a small WORLD_SIZE): whatever the
// flags, the worker neither panics nor allocates more than 64 MiB, nor takes
// long, and exits 0 or 2. args holds the arguments, one per line.
func FuzzWorkloadFlags(f *testing.F) {
	names := workloadNames()
	index := map[string]uint8{}
	for i, n := range names {
		index[n] = uint8(i)
	}
	for _, s := range []struct {
		workload string
		world    uint8
		args     []string
	}{
		{"hello", 0, nil},
		{"exit", 1, []string{"3", "1"}},
		{"sleep", 0, []string{"10m"}},
		{"barrier", 1, nil},
		{"mlp", 1, nil},
		{"mlp", 3, []string{"--mesh", "dp=2,tp=2", "--tokens", "64", "--hidden", "32", "--ffn", "128", "--steps", "5"}},
		{"mlp", 1, []string{"--sequence-parallel", "--dtype", "bfloat16", "--grad-dtype", "bfloat16", "--seed", "7", "--lr", "0.1"}},
		{"mlp", 7, []string{"--mesh", "2x2x2", "--device", "sim", "--kernels", "cpu"}},
		{"mlp", 1, []string{"--tokens", "1000000000", "--hidden", "1000000000"}},
		{"mlp", 1, []string{"--tokens", "20000", "--hidden", "20000"}},
		{"mlp", 1, []string{"--save", "ckpt", "--save-every", "5", "--keep", "2", "--save-sync=false"}},
		{"mlp", 0, []string{"--mesh", "1x1x1x1x1x1x1x1", "--hidden", "8"}},
		// Once over 64 MiB: the flattened steps of an 8-D mesh, and the
		// shards of a 16-D tensor, allocated per candidate step.
		{"mlp", 7, []string{"--mesh", "2x1x2x1x2x1x1x1"}},
		{"linear", 7, []string{"--mesh", "2x2x2", "--x", "2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x16:[S(0),S(1),S(2)]", "--w", "32x16:[R,R,S(0)]"}},
		{"mlp", 1, []string{"--mesh", "1000000x1000000"}},
		{"linear", 1, []string{"--mesh", "2", "--x", "8x16:[S(0)]", "--w", "32x16:[S(0)]", "--b", "32:[S(0)]", "--grads", "x,w"}},
		{"linear", 3, []string{"--mesh", "dp=2,tp=2", "--x", "8x16:[S(0),R]", "--w", "32x16:[R,S(0)]", "--out", "[S(0),S(1)]"}},
		{"linear", 1, []string{"--mesh", "2", "--x", "2x5x7:[S(1)]", "--w", "4x7:[P]", "--grads", "none"}},
		{"linear", 1, []string{"--mesh", "2", "--x", "16777216x16777216:[S(0)]", "--w", "16777216x16777216:[R]"}},
		{"verify", 3, []string{"--quick", "--ops", "linear"}},
		{"verify", 0, []string{"--world", "1"}},
		{"mlp", 1, []string{"-h"}},
	} {
		f.Add(index[s.workload], s.world, strings.Join(s.args, "\n"))
	}
	old := memAvailable
	memAvailable = func() (int64, bool) { return 16 << 30, true }
	f.Cleanup(func() { memAvailable = old })
	f.Fuzz(func(t *testing.T, workload, world uint8, args string) {
		argv := []string{names[int(workload)%len(names)]}
		if args != "" {
			argv = append(argv, strings.Split(args, "\n")...)
		}
		ws := strconv.Itoa(1 + int(world)%8)
		env := map[string]string{EnvCheck: "1", "WORLD_SIZE": ws, "LOCAL_WORLD_SIZE": ws, "RANK": "0", "LOCAL_RANK": "0"}
		var out, errb bytes.Buffer
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		start := time.Now()
		code := Main(context.Background(), Env{Args: argv, Getenv: func(k string) string { return env[k] }, Stdout: &out, Stderr: &errb})
		d := time.Since(start)
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > fuzzMaxAlloc {
			t.Fatalf("%q (WORLD_SIZE=%s) allocated %d MiB; stderr %q", argv, ws, n>>20, errb.String())
		}
		if d > 10*time.Second {
			t.Fatalf("%q (WORLD_SIZE=%s) took %v", argv, ws, d)
		}
		if code != 0 && code != ExitUsage {
			t.Fatalf("%q (WORLD_SIZE=%s): exit %d; stderr %q", argv, ws, code, errb.String())
		}
	})
}
