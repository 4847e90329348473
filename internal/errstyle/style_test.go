package errstyle

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// moduleRoot is the folder of go.mod, two levels up.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	return root
}

// sourceFile is one parsed non-test Go file of the module.
type sourceFile struct {
	path string // relative to the module root
	pkg  string // package name
	dir  string // folder, relative to the module root
	file *ast.File
}

// parseModule parses every non-test Go file of the module, testdata and
// hidden folders left out.
func parseModule(t *testing.T) (*token.FileSet, []sourceFile) {
	t.Helper()
	root := moduleRoot(t)
	fset := token.NewFileSet()
	var files []sourceFile
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		files = append(files, sourceFile{path: rel, pkg: f.Name.Name, dir: filepath.Dir(rel), file: f})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no Go files found")
	}
	return fset, files
}

// isSentinelName reports an exported error variable's name: Err and a capital.
func isSentinelName(name string) bool {
	return len(name) > 3 && strings.HasPrefix(name, "Err") && name[3] >= 'A' && name[3] <= 'Z'
}

// callOf returns call's function as "pkg.Name" (selector) or "Name".
func callOf(call *ast.CallExpr) string {
	switch fn := call.Fun.(type) {
	case *ast.SelectorExpr:
		if x, ok := fn.X.(*ast.Ident); ok {
			return x.Name + "." + fn.Sel.Name
		}
	case *ast.Ident:
		return fn.Name
	}
	return ""
}

// sentinels maps a folder (relative to the module root) to its exported
// sentinels, and also returns their import paths' last elements' sets by
// import path.
func sentinels(files []sourceFile) map[string]map[string]bool {
	byDir := map[string]map[string]bool{}
	for _, sf := range files {
		for _, decl := range sf.file.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for _, n := range vs.Names {
					if isSentinelName(n.Name) {
						if byDir[sf.dir] == nil {
							byDir[sf.dir] = map[string]bool{}
						}
						byDir[sf.dir][n.Name] = true
					}
				}
			}
		}
	}
	return byDir
}

// TestSentinelStyle checks the module's source against the error style (see
// the package comment): every exported sentinel made with errors.New reads
// "PKG: what" and names PKG once; one set to another package's sentinel has a
// doc comment naming that sentinel; and every fmt.Errorf that wraps a sentinel
// of the module (its own package's ErrX, or pkg.ErrX of a module package)
// starts with "%w", adding no prefix before the sentinel's.
func TestSentinelStyle(t *testing.T) {
	fset, files := parseModule(t)
	const module = "github.com/meshrun/meshrun"
	byDir := sentinels(files)
	seen := 0
	for _, sf := range files {
		for _, decl := range sf.file.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if !isSentinelName(n.Name) || i >= len(vs.Values) {
						continue
					}
					pos := fset.Position(n.Pos())
					switch v := vs.Values[i].(type) {
					case *ast.CallExpr:
						if callOf(v) != "errors.New" || len(v.Args) != 1 {
							continue
						}
						lit, ok := v.Args[0].(*ast.BasicLit)
						if !ok {
							t.Errorf("%s:%d: %s: errors.New of a non-literal", sf.path, pos.Line, n.Name)
							continue
						}
						msg, _ := strconv.Unquote(lit.Value)
						seen++
						prefix := sf.pkg + ": "
						if !strings.HasPrefix(msg, prefix) {
							t.Errorf("%s:%d: %s = %q: want the message to start with %q", sf.path, pos.Line, n.Name, msg, prefix)
						} else if strings.Contains(msg[len(prefix):], prefix) {
							t.Errorf("%s:%d: %s = %q names %q twice", sf.path, pos.Line, n.Name, msg, sf.pkg)
						}
					case *ast.SelectorExpr:
						x, ok := v.X.(*ast.Ident)
						if !ok || !isSentinelName(v.Sel.Name) {
							continue
						}
						alias := x.Name + "." + v.Sel.Name
						doc := vs.Doc.Text() + vs.Comment.Text()
						if !strings.Contains(doc, alias) {
							t.Errorf("%s:%d: %s = %s: want a doc comment that names %s", sf.path, pos.Line, n.Name, alias, alias)
						}
					}
				}
			}
		}

		// The import name of each module package this file imports, to
		// its folder.
		imports := map[string]string{}
		for _, im := range sf.file.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			rest, ok := strings.CutPrefix(p, module+"/")
			if !ok {
				continue
			}
			name := filepath.Base(rest)
			if im.Name != nil {
				name = im.Name.Name
			}
			imports[name] = filepath.FromSlash(rest)
		}
		// A wrapped argument that is a sentinel of the module.
		isSentinel := func(e ast.Expr) (string, bool) {
			switch e := e.(type) {
			case *ast.Ident:
				return e.Name, byDir[sf.dir][e.Name]
			case *ast.SelectorExpr:
				if x, ok := e.X.(*ast.Ident); ok {
					if dir, ok := imports[x.Name]; ok && byDir[dir][e.Sel.Name] {
						return x.Name + "." + e.Sel.Name, true
					}
				}
			}
			return "", false
		}
		ast.Inspect(sf.file, func(node ast.Node) bool {
			call, ok := node.(*ast.CallExpr)
			if !ok || callOf(call) != "fmt.Errorf" || len(call.Args) < 2 {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			format, _ := strconv.Unquote(lit.Value)
			if !strings.Contains(format, "%w") {
				return true
			}
			for _, arg := range call.Args[1:] {
				if name, ok := isSentinel(arg); ok && !strings.HasPrefix(format, "%w") {
					pos := fset.Position(call.Pos())
					t.Errorf("%s:%d: fmt.Errorf(%q, ...) wraps %s: want the format to start with %%w", sf.path, pos.Line, format, name)
				}
			}
			return true
		})
	}
	if seen < 20 {
		t.Errorf("found %d sentinels; the walk of the module missed some", seen)
	}
}
