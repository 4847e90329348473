package job

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestAttentionWorkload runs ring attention on 3 in-process ranks, zigzag
// and contiguous: every rank sent (cp-1)/cp of the keys and values forward
// and the same again with their gradients backward, and held two blocks.
func TestAttentionWorkload(t *testing.T) {
	for _, layout := range []string{"zigzag", "contiguous"} {
		code, out, errs := run(t, "attention", "--mesh", "cp=3", "--seq", "96", "--heads", "2", "--dim", "8", "--layout", layout, "--steps", "1")
		if code != 0 {
			t.Fatalf("%s: exit %d: %s %s", layout, code, out, errs)
		}
		var r AttentionReport
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%v: %q", err, out)
		}
		block := int64(4 * 96 / 3 * 2 * 16) // a rank's K and V
		if r.SentBytes != 2*block+2*2*block+block || r.KVBytes != 4*block || r.Layout != layout {
			t.Errorf("%s: report %+v, want %d B sent and %d B of K/V held", layout, r, 7*block, 4*block)
		}
	}
}

// TestContextParallelBadInput: a cp dim where there is no sequence, and a
// sequence too short for zigzag, are one line and exit 2 before any work.
func TestContextParallelBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"mlp", "--mesh", "cp=2"}, "no sequence dim to split over cp"},
		{[]string{"attention", "--mesh", "cp=4", "--seq", "7"}, "needs at least 2·cp = 8"},
		{[]string{"attention", "--mesh", "tp=2"}, "one dim named cp"},
		{[]string{"attention", "--layout", "spiral"}, `layout "spiral"`},
	} {
		code, out, errs := runEnv(t, map[string]string{"WORLD_SIZE": "2", EnvCheck: "1"}, c.args...)
		if c.args[2] == "cp=4" {
			code, out, errs = runEnv(t, map[string]string{"WORLD_SIZE": "4", EnvCheck: "1"}, c.args...)
		}
		if code != ExitUsage || out != "" || !strings.Contains(errs, c.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("%v: exit %d, %q %q; want exit 2 and one line with %q", c.args, code, out, errs, c.want)
		}
	}
}
