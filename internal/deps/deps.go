// Package deps lists a package's dependencies with the go tool, for the tests
// that keep the layering of docs/architecture.md from regressing (which
// package may import which).
package deps

import (
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// Module is this module's path.
const Module = "github.com/meshrun/meshrun"

// Package is one dependency.
type Package struct {
	ImportPath string
	Standard   bool // part of the standard library
}

// Of returns every package pkgs depend on, pkgs included, as `go list -deps`
// lists them: test files are not read. It skips t when the go tool is not
// found and fails it when go list fails.
func Of(t testing.TB, pkgs ...string) []Package {
	t.Helper()
	var deps []Package
	for _, line := range list(t, "{{.ImportPath}} {{.Standard}}", pkgs) {
		path, std, _ := strings.Cut(line, " ")
		deps = append(deps, Package{ImportPath: path, Standard: std == "true"})
	}
	return deps
}

// Forbid fails t for every dependency of pkgs that is one of forbidden or lies
// under one (a forbidden path's subpackages are forbidden too).
func Forbid(t testing.TB, pkgs []string, forbidden ...string) {
	t.Helper()
	for _, d := range Of(t, pkgs...) {
		for _, f := range forbidden {
			if d.ImportPath == f || strings.HasPrefix(d.ImportPath, f+"/") {
				t.Errorf("the dependencies of %s include %s (forbidden: %s)", strings.Join(pkgs, ", "), d.ImportPath, f)
			}
		}
	}
}

// Importers returns, sorted, every dependency of pkgs (pkgs included, test
// files not read) that imports target itself, or a package under it.
func Importers(t testing.TB, target string, pkgs ...string) []string {
	t.Helper()
	var importers []string
	for _, line := range list(t, "{{.ImportPath}} {{.Imports}}", pkgs) {
		path, imports, _ := strings.Cut(line, " ")
		for _, imp := range strings.Fields(strings.Trim(imports, "[]")) {
			if imp == target || strings.HasPrefix(imp, target+"/") {
				importers = append(importers, path)
				break
			}
		}
	}
	sort.Strings(importers)
	return importers
}

// list runs `go list -deps -f format pkgs` and returns its lines. It skips t
// when the go tool is not found and fails it when go list fails.
func list(t testing.TB, format string, pkgs []string) []string {
	t.Helper()
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH: ", err)
	}
	args := append([]string{"list", "-deps", "-f", format}, pkgs...)
	out, err := exec.Command(gotool, args...).Output()
	if err != nil {
		msg := err.Error()
		if ee, ok := err.(*exec.ExitError); ok {
			msg += ": " + string(ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %s", strings.Join(pkgs, " "), msg)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}
