package job

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// settingsBelowJob are the trees whose settings the worker reads where it
// starts (job, bootstrap.EnvConfig) and passes down as values.
var settingsBelowJob = []string{"kernels", "collective", "transport"}

// envReads lists the calls of os.Getenv, os.LookupEnv and os.Environ in
// file (whatever name it imports os under), as "file:line: os.Name".
func envReads(fset *token.FileSet, file *ast.File) []string {
	names := map[string]bool{}
	for _, imp := range file.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == "os" {
			name := "os"
			if imp.Name != nil {
				name = imp.Name.Name
			}
			names[name] = true
		}
	}
	var reads []string
	ast.Inspect(file, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok && names[x.Name] {
			switch sel.Sel.Name {
			case "Getenv", "LookupEnv", "Environ":
				reads = append(reads, fset.Position(sel.Pos()).String()+": os."+sel.Sel.Name)
			}
		}
		return true
	})
	return reads
}

// TestSettingsReadOnce: no non-test Go file under kernels/, collective/ or
// transport/ reads the process environment (os.Getenv, os.LookupEnv,
// os.Environ, called or passed as a value): their settings are options the
// worker reads once, from its Env (cuda.OptionsFrom, the nccl backend's
// library path, bootstrap.EnvConfig). Every file is parsed, whatever its
// build tags (the cuda-tagged ones too); testdata is skipped.
func TestSettingsReadOnce(t *testing.T) {
	fset := token.NewFileSet()
	// The check itself finds a read, under another import name too.
	probe, err := parser.ParseFile(fset, "probe.go", "package p\nimport o \"os\"\nvar g = o.Getenv\nfunc f() { _, _ = o.LookupEnv(\"X\") }\n", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := envReads(fset, probe); len(got) != 2 {
		t.Fatalf("the check finds %v in its probe, want its 2 reads", got)
	}
	files, tagged := 0, 0
	for _, dir := range settingsBelowJob {
		root := filepath.Join("..", dir)
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if d.Name() == "testdata" || (strings.HasPrefix(d.Name(), ".") && path != root) {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			if err != nil {
				return err
			}
			files++
			for _, c := range f.Comments {
				if c.Pos() < f.Package && strings.HasPrefix(c.List[0].Text, "//go:build") {
					tagged++
					break
				}
			}
			for _, r := range envReads(fset, f) {
				t.Errorf("%s: a setting read below the worker: read it in job (or bootstrap.EnvConfig) and pass it down", r)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if files == 0 || tagged == 0 {
		t.Fatalf("parsed %d files, %d of them with build tags: the trees moved?", files, tagged)
	}
}
