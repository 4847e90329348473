package deps_test

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// The package map of docs/architecture.md is the module's import rules: one
// table row per package (or per group of packages), with the packages it may
// import beside it. TestArchitecture reads the table and holds every package
// of the module to its row, in the plain build and in the cuda build; a
// package the table does not name, a row naming a package that does not
// exist, and an import the row does not allow all fail it. So the map cannot
// drift from the code: a new import that crosses a layer changes the
// document in the same commit, where a reviewer reads it.
//
// The rules the map cannot say (who may link what, transitively) name the
// test that keeps each of them; TestArchitectureRulesTested checks that every
// test named there exists.

const archDoc = "../../docs/architecture.md"

// row is one line of the package map: the packages it names and what they
// may import (module packages relative to the module, others by full path; a
// trailing /... allows a subtree).
type row struct {
	pkgs, may []string
	line      int
}

var ticked = regexp.MustCompile("`([^`]+)`")

// packageMap reads the first table under the "## Package map" heading.
func packageMap(t *testing.T) []row {
	t.Helper()
	f, err := os.Open(archDoc)
	if err != nil {
		t.Fatalf("the package map: %v", err)
	}
	defer f.Close()
	var rows []row
	in, table := false, false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## Package map"
			continue
		case !in:
			continue
		case !strings.HasPrefix(line, "|"):
			if table {
				return rows
			}
			continue
		}
		table = true
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 || strings.HasPrefix(strings.TrimSpace(cells[0]), "---") || strings.TrimSpace(cells[0]) == "package" {
			continue
		}
		r := row{line: n}
		for _, m := range ticked.FindAllStringSubmatch(cells[0], -1) {
			r.pkgs = append(r.pkgs, m[1])
		}
		for _, m := range ticked.FindAllStringSubmatch(cells[2], -1) {
			r.may = append(r.may, m[1])
		}
		if len(r.pkgs) == 0 {
			t.Fatalf("%s:%d: a row of the package map names no package", archDoc, n)
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no package map (a table under \"## Package map\")", archDoc)
	}
	return rows
}

// imports lists every package of the module with the packages it imports
// directly, in the build the tags select (test files not read).
func imports(t *testing.T, tags string) map[string][]string {
	t.Helper()
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool in PATH: ", err)
	}
	out, err := exec.Command(gotool, "list", "-tags", tags, "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", deps.Module+"/...").Output()
	if err != nil {
		msg := err.Error()
		if ee, ok := err.(*exec.ExitError); ok {
			msg += ": " + string(ee.Stderr)
		}
		t.Fatalf("go list -tags %q: %s", tags, msg)
	}
	m := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		m[strings.TrimPrefix(f[0], deps.Module+"/")] = f[1:]
	}
	return m
}

// standard says whether path is a standard library package (no dot in its
// first element).
func standard(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".")
}

func allows(may []string, imp string) bool {
	return slices.ContainsFunc(may, func(a string) bool {
		base, tree := strings.CutSuffix(a, "/...")
		return imp == base || tree && strings.HasPrefix(imp, base+"/")
	})
}

func TestArchitecture(t *testing.T) {
	rows := packageMap(t)
	of := map[string]row{}
	for _, r := range rows {
		for _, p := range r.pkgs {
			if prev, dup := of[p]; dup {
				t.Errorf("%s:%d: %s is in the package map twice (line %d too)", archDoc, r.line, p, prev.line)
			}
			of[p] = r
		}
	}
	seen := map[string]bool{}
	for _, tags := range []string{"", "cuda"} {
		for pkg, imps := range imports(t, tags) {
			seen[pkg] = true
			r, ok := of[pkg]
			if !ok {
				t.Errorf("%s is not in the package map of docs/architecture.md", pkg)
				continue
			}
			for _, imp := range imps {
				if standard(imp) {
					continue
				}
				rel := strings.TrimPrefix(imp, deps.Module+"/")
				if !allows(r.may, rel) {
					t.Errorf("%s imports %s (tags %q), which its row of the package map (%s:%d) does not allow: %v", pkg, rel, tags, archDoc, r.line, r.may)
				}
			}
		}
	}
	for p, r := range of {
		if !seen[p] {
			t.Errorf("%s:%d: the package map names %s, which is not a package of the module", archDoc, r.line, p)
		}
	}
}

// testRef is a test the document names as keeping a rule: `dir.TestName`.
var testRef = regexp.MustCompile("`([a-z0-9/]+)\\.(Test[A-Za-z0-9_]+)`")

func TestArchitectureRulesTested(t *testing.T) {
	doc, err := os.ReadFile(archDoc)
	if err != nil {
		t.Fatal(err)
	}
	refs := testRef.FindAllStringSubmatch(string(doc), -1)
	if len(refs) < 5 {
		t.Fatalf("docs/architecture.md names %d tests for its rules", len(refs))
	}
	for _, m := range refs {
		dir, name := m[1], m[2]
		files, _ := filepath.Glob(filepath.Join("../..", dir, "*_test.go"))
		found := false
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(b), "func "+name+"(") {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("docs/architecture.md names %s.%s, which is not a test in %s", dir, name, dir)
		}
	}
}

// testSupport says whether pkg (relative to the module) is test support: a
// package whose name starts or ends in "test" (collectivetest, kerneltest,
// internal/testtime...), written for tests to import.
func testSupport(pkg string) bool {
	base := filepath.Base(pkg)
	return strings.HasPrefix(base, "test") || strings.HasSuffix(base, "test")
}

// Test support stays in tests: no package that is not test support itself
// depends on one (test files are not read), so that no production binary
// carries a test double.
func TestTestSupportUnlinked(t *testing.T) {
	var prod []string
	var support []string
	for pkg := range imports(t, "") {
		if testSupport(pkg) {
			support = append(support, deps.Module+"/"+pkg)
		} else {
			prod = append(prod, deps.Module+"/"+pkg)
		}
	}
	if len(support) < 5 {
		t.Fatalf("only %d test support packages: %v", len(support), support)
	}
	slices.Sort(prod)
	for _, tags := range []string{"", "cuda"} {
		for _, d := range deps.OfTags(t, tags, prod...) {
			if slices.Contains(support, d.ImportPath) {
				// Name the packages that pull it in.
				for _, p := range prod {
					deps.ForbidTags(t, tags, []string{p}, d.ImportPath)
				}
			}
		}
	}
}

// Size is a budget: no hand-written Go file over 700 lines, and no package
// over 5,000 lines of non-test Go, so that each can be read in a sitting.
// Generated files (a "Code generated ... DO NOT EDIT." line) and testdata do
// not count.
func TestSizes(t *testing.T) {
	const maxFile, maxPackage = 700, 5000
	perPkg := map[string]int{}
	root := "../.."
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if generated.Match(b) {
			return nil
		}
		lines := strings.Count(string(b), "\n")
		rel, _ := filepath.Rel(root, p)
		if lines > maxFile {
			t.Errorf("%s: %d lines (at most %d: split it by role)", rel, lines, maxFile)
		}
		if !strings.HasSuffix(p, "_test.go") {
			perPkg[filepath.Dir(rel)] += lines
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for pkg, n := range perPkg {
		if n > maxPackage {
			t.Errorf("package %s: %d lines of non-test Go (at most %d: split it by role)", pkg, n, maxPackage)
		}
	}
	if len(perPkg) < 20 {
		t.Fatalf("only %d packages counted", len(perPkg))
	}
}

var generated = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

// The core is pure: placement and spmd take specs and return plans, the same
// every time, and pipeline takes orders and returns timelines. They import nothing that does I/O or reads the clock or
// randomness (a Planner may be shared, so sync is allowed), and start no
// goroutine.
func TestPure(t *testing.T) {
	impure := []string{"os", "net", "time", "syscall", "io/fs", "log", "math/rand", "math/rand/v2", "os/exec", "os/signal", "net/http", "unsafe"}
	all := imports(t, "")
	for _, pkg := range []string{"placement", "spmd", "pipeline"} {
		for _, imp := range all[pkg] {
			if slices.Contains(impure, imp) || strings.HasPrefix(imp, "net/") || strings.HasPrefix(imp, "os/") {
				t.Errorf("%s imports %s: the core does no I/O and reads no clock", pkg, imp)
			}
		}
		files, err := filepath.Glob(filepath.Join("../..", pkg, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no files (%v)", pkg, err)
		}
		fset := token.NewFileSet()
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(af, func(n ast.Node) bool {
				if g, ok := n.(*ast.GoStmt); ok {
					t.Errorf("%s: a go statement: the core starts no goroutine", fset.Position(g.Pos()))
				}
				return true
			})
		}
	}
}
