package job

import (
	"strings"
	"testing"
	"time"
)

// withMemory makes memAvailable report n bytes for the test.
func withMemory(t *testing.T, n int64) {
	t.Helper()
	old := memAvailable
	memAvailable = func() (int64, bool) { return n, true }
	t.Cleanup(func() { memAvailable = old })
}

// TestAbsurdSizes: sizes that overflow, exceed a bound or cannot fit in
// memory are refused in the workload's setup (what the launcher's check
// runs before any rank starts) with exit 2 and one line naming them, at
// once, allocating nothing of their size.
func TestAbsurdSizes(t *testing.T) {
	withMemory(t, 11<<30+200<<20) // 11.2 GiB
	two := map[string]string{"LOCAL_WORLD_SIZE": "2"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"tokens x hidden overflows a tensor", []string{"mlp", "--tokens", "1000000000", "--hidden", "1000000000"}, two,
			"x [tokens 1000000000, hidden 1000000000] would hold more than 281474976710656 elements"},
		{"the default ffn overflows", []string{"mlp", "--hidden", "3000000000000000000"}, two,
			"--hidden 3000000000000000000: the default --ffn, 4 x --hidden, is too large"},
		{"ffn x hidden", []string{"mlp", "--hidden", "100000000", "--ffn", "4000000000"}, two, "w1 [ffn 4000000000, hidden 100000000]"},
		{"more memory than the machine has", []string{"mlp", "--tokens", "20000", "--hidden", "20000"}, two,
			"needs about 49.9 GiB per rank (params 6.0 GiB, gradients 6.0 GiB, activations 23.1 GiB, scratch 14.9 GiB) x 2 ranks on this machine; 11.2 GiB available (MESHRUN_MEMORY_CHECK=0 skips this check)"},
		{"alone, every rank in this process", []string{"mlp", "--mesh", "tp=2", "--tokens", "20000", "--hidden", "20000"}, map[string]string{"WORLD_SIZE": ""},
			"x 2 ranks on this machine"},
		{"one rank", []string{"mlp", "--mesh", "1", "--tokens", "20000", "--hidden", "20000"}, map[string]string{"WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"},
			"x 1 rank on this machine"},
		{"a mesh of a trillion devices", []string{"mlp", "--mesh", "1000000x1000000"}, two, "--mesh: placement: too large: size 1000000 is more than 65536 in mesh \"1000000x1000000\""},
		{"a mesh over the device bound", []string{"mlp", "--mesh", "4096x4096"}, two, "mesh 4096x4096 holds more than 65536 devices"},
		{"a mesh of too many dims", []string{"mlp", "--mesh", "1x1x1x1x1x1x1x1x2"}, two, "has 9 dims, more than the 8"},
		{"a search over the budget", []string{"mlp", "--mesh", "2x2x2x2x2x2"}, map[string]string{"WORLD_SIZE": "64"}, "planning budget exceeded"},
		{"a linear layer too large", []string{"linear", "--mesh", "2", "--x", "16777216x16777216x16:[S(0)]", "--w", "32x16:[R]"}, two,
			"shape 16777216x16777216x16 holds more than 281474976710656 elements"},
		{"a linear reference too long", []string{"linear", "--mesh", "2", "--x", "100000x100000:[S(0)]", "--w", "100000x100000:[R]"}, two,
			"x 100000x100000 and w 100000x100000: checking the result against the float64 reference takes 1000000000000000 multiply-adds"},
		{"a linear layer over memory", []string{"linear", "--mesh", "2", "--x", "20000x1:[S(0)]", "--w", "20000x1:[R]"}, two,
			"needs about 8.9 GiB per rank (data 1.5 GiB, reference 6.0 GiB, results 1.5 GiB) x 2 ranks on this machine"},
		{"verify on too many ranks", []string{"verify", "--world", "100000"}, map[string]string{"WORLD_SIZE": ""}, "--world 100000: more than the 65536 ranks"},
		{"verify's largest case", []string{"verify", "--world", "4096"}, map[string]string{"WORLD_SIZE": ""}, "4096 ranks: x 8192x8192 and w 16384x8192"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, out, errs := check(t, tc.env, tc.args...)
			if code != ExitUsage || out != "" || strings.Count(errs, "\n") != 1 || !strings.Contains(errs, tc.want) {
				t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", tc.args, code, out, errs, tc.want)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("%v took %v", tc.args, d)
			}
		})
	}
	// The check can be skipped, and a block that fits passes it.
	for _, env := range []map[string]string{{"LOCAL_WORLD_SIZE": "2", EnvMemoryCheck: "0"}, {"LOCAL_WORLD_SIZE": "2"}} {
		args := []string{"mlp", "--tokens", "20000", "--hidden", "20000"}
		if env[EnvMemoryCheck] == "" {
			args = []string{"mlp", "--tokens", "4096", "--hidden", "4096"}
		}
		if code, out, errs := check(t, env, args...); code != 0 || out != "" || errs != "" {
			t.Errorf("%v %v: exit %d, stdout %q, stderr %q", args, env, code, out, errs)
		}
	}
}
