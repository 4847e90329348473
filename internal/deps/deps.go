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
	return OfTags(t, "", pkgs...)
}

// OfTags is Of for a build with the comma-separated build tags ("" for
// none): a tagged build may import what the plain one does not.
func OfTags(t testing.TB, tags string, pkgs ...string) []Package {
	t.Helper()
	var deps []Package
	for _, line := range List(t, tags, true, "{{.ImportPath}} {{.Standard}}", pkgs...) {
		path, std, _ := strings.Cut(line, " ")
		deps = append(deps, Package{ImportPath: path, Standard: std == "true"})
	}
	return deps
}

// Forbid fails t for every dependency of pkgs that is one of forbidden or lies
// under one (a forbidden path's subpackages are forbidden too).
func Forbid(t testing.TB, pkgs []string, forbidden ...string) {
	t.Helper()
	ForbidTags(t, "", pkgs, forbidden...)
}

// ForbidTags is Forbid for a build with the comma-separated build tags.
func ForbidTags(t testing.TB, tags string, pkgs []string, forbidden ...string) {
	t.Helper()
	build := ""
	if tags != "" {
		build = " (-tags " + tags + ")"
	}
	for _, d := range OfTags(t, tags, pkgs...) {
		for _, f := range forbidden {
			if d.ImportPath == f || strings.HasPrefix(d.ImportPath, f+"/") {
				t.Errorf("the dependencies of %s%s include %s (forbidden: %s)", strings.Join(pkgs, ", "), build, d.ImportPath, f)
			}
		}
	}
}

// Imports returns the packages pkgs match (patterns such as Module+"/...")
// with the packages each imports directly, as `go list` lists them: test
// files are not read.
func Imports(t testing.TB, pkgs ...string) map[string][]string {
	t.Helper()
	imports := map[string][]string{}
	for _, line := range List(t, "", false, "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", pkgs...) {
		f := strings.Fields(line)
		imports[f[0]] = f[1:]
	}
	return imports
}

// Importers returns, sorted, every dependency of pkgs (pkgs included, test
// files not read) that imports target itself, or a package under it.
func Importers(t testing.TB, target string, pkgs ...string) []string {
	t.Helper()
	var importers []string
	for _, line := range List(t, "", true, "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", pkgs...) {
		f := strings.Fields(line)
		for _, imp := range f[1:] {
			if imp == target || strings.HasPrefix(imp, target+"/") {
				importers = append(importers, f[0])
				break
			}
		}
	}
	sort.Strings(importers)
	return importers
}

// List runs `go list [-deps] [-tags tags] -f format pkgs` and returns its
// lines. It skips t when the go tool is not found and fails it when go list
// fails.
func List(t testing.TB, tags string, withDeps bool, format string, pkgs ...string) []string {
	t.Helper()
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH: ", err)
	}
	args := []string{"list", "-f", format}
	if withDeps {
		args = append(args, "-deps")
	}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, pkgs...)
	out, err := exec.Command(gotool, args...).Output()
	if err != nil {
		msg := err.Error()
		if ee, ok := err.(*exec.ExitError); ok {
			msg += ": " + string(ee.Stderr)
		}
		t.Fatalf("go %s: %s", strings.Join(args, " "), msg)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}
