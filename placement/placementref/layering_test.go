package placementref_test

import (
	"path"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// testSupport says whether pkg is test support: a package whose name starts
// or ends in "test" (internal/testtime, collectivetest, spmdtest...), which
// only tests import (internal/deps TestTestSupportUnlinked).
func testSupport(pkg string) bool {
	base := path.Base(pkg)
	return strings.HasSuffix(base, "test") || strings.HasPrefix(base, "test")
}

// The reference model moves every element by hand: it is for checking, not
// for running plans (package redistribute does that). Outside tests, only
// job's verify workload runs it, to compute the values a job's collectives
// must produce; it also uses spmd/spmdref's reference ops, which run on it.
// So, in non-test files:
//
//   - placementref is imported by job, spmd/spmdref and test support only;
//   - spmd/spmdref by job only (spmd's TestLayeringReference);
//   - hence the packages that depend on placementref are job, the packages
//     that import job (the worker), spmdref, test support and placementref
//     itself; no other package of the module does.
func TestLayering(t *testing.T) {
	const (
		ref     = deps.Module + "/placement/placementref"
		job     = deps.Module + "/job"
		spmdref = deps.Module + "/spmd/spmdref"
	)
	imports := deps.Imports(t, deps.Module+"/...")
	importers := map[string][]string{ref: {job, spmdref}, spmdref: {job}}
	for pkg, imps := range imports {
		for _, imp := range imps {
			if allowed, ok := importers[imp]; ok && !slices.Contains(allowed, pkg) && !testSupport(pkg) {
				t.Errorf("%s imports %s (allowed: %v and test support)", pkg, imp, allowed)
			}
		}
	}
	// Every other package, the library and the launcher among them, is free of
	// it: all but job and its importers (to any depth), placementref, spmdref
	// and test support.
	withJob := map[string]bool{job: true}
	for grew := true; grew; {
		grew = false
		for pkg, imps := range imports {
			if !withJob[pkg] && slices.ContainsFunc(imps, func(p string) bool { return withJob[p] }) {
				withJob[pkg], grew = true, true
			}
		}
	}
	var others []string
	for pkg := range imports {
		if _, ref := importers[pkg]; !ref && !withJob[pkg] && !testSupport(pkg) {
			others = append(others, pkg)
		}
	}
	sort.Strings(others)
	if len(others) < 20 {
		t.Fatalf("only %d packages to check: %v", len(others), others)
	}
	deps.Forbid(t, others, ref)
}
