// Package spmdtest holds what tests of the planner share: cost models that
// make tiny test tensors plan as wide layers do. Only tests import it; the
// reference implementations the tests check against are package spmdref.
package spmdtest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/meshrun/meshrun/placement"
)

// LargeLayers is a cost model for tests that plan tiny tensors and mean the
// plans of wide layers. A layer of width 4096 does 256 times more arithmetic
// per byte it communicates than one of width 16, and its latency is
// negligible next to its bytes; so the model has no latency and a GEMM rate
// 256 times below placement.DefaultModel's for its bandwidth. Under it a
// Megatron layer on a 16-wide test tensor splits its work as it would at
// 4096; under DefaultModel such a tensor is cheaper computed whole on every
// rank than communicated.
var LargeLayers = placement.Model{Name: "large-layer proportions", Gamma: 1e-6, Beta: 5e9, Flops: 190e9 / 256, ElemBytes: 4}

// LargeLayersFile writes LargeLayers as JSON into a temporary directory of t,
// for commands that take --model FILE, and returns the path.
func LargeLayersFile(t testing.TB) string {
	t.Helper()
	b, err := json.Marshal(LargeLayers)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "model.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
