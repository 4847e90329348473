package spmd

import (
	"strings"
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// modulePackages lists every package of the module (test files not read).
func modulePackages(t *testing.T) []string {
	t.Helper()
	var pkgs []string
	for _, p := range deps.Of(t, deps.Module+"/...") {
		if strings.HasPrefix(p.ImportPath, deps.Module+"/") {
			pkgs = append(pkgs, p.ImportPath)
		}
	}
	return pkgs
}

// except is pkgs less the ones named.
func except(pkgs []string, names ...string) []string {
	var out []string
	for _, p := range pkgs {
		keep := true
		for _, n := range names {
			keep = keep && p != deps.Module+"/"+n
		}
		if keep {
			out = append(out, p)
		}
	}
	return out
}

// forbid fails t for every package of pkgs that depends on forbidden (or a
// package under it), naming each: one go list for them all, and one per
// package only when some does.
func forbid(t *testing.T, pkgs []string, forbidden string) {
	t.Helper()
	for _, d := range deps.Of(t, pkgs...) {
		if d.ImportPath == forbidden || strings.HasPrefix(d.ImportPath, forbidden+"/") {
			for _, p := range pkgs {
				deps.Forbid(t, []string{p}, forbidden)
			}
			return
		}
	}
}

// The reference implementations (spmd/spmdref) are production code for one
// workload: the worker's verify (package job) checks the distributed ops
// against them. No other package imports them, so only job and the worker
// binary that links job (cmd/worker) depend on them; a planner, a layer or
// the launcher that computed through the reference would be checked against
// itself.
func TestLayeringReference(t *testing.T) {
	pkgs := except(modulePackages(t), "job", "cmd/worker", "spmd/spmdref")
	forbid(t, pkgs, deps.Module+"/spmd/spmdref")
}

// spmd/spmdtest is test support (cost models for tiny test tensors): no
// package's non-test code depends on it, the verify workload included.
func TestLayeringTestSupport(t *testing.T) {
	pkgs := except(modulePackages(t), "spmd/spmdtest")
	forbid(t, pkgs, deps.Module+"/spmd/spmdtest")
}
