package bootstrap_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// The NATS client library is bootstrap's: the rendezvous, the control plane,
// the connection it gives the nats data path, and the connection settings and
// credentials (bootstrap/natsconn). Below the launcher every package reaches
// NATS through it; above, the launcher (launch, which also serves the job's
// coordination plane) and the benchmarks' drivers may use the client
// directly. A worker links no other importer of it.
func TestLayeringNATSClient(t *testing.T) {
	const nats = "github.com/nats-io/nats.go"
	for _, p := range deps.Importers(t, nats, deps.Module+"/...") {
		if underAny(p, deps.Module) && !underAny(p, deps.Module+"/bootstrap", deps.Module+"/launch", deps.Module+"/bench") {
			t.Errorf("%s imports %s: below the launcher only bootstrap may", p, nats)
		}
	}
	for _, p := range deps.Importers(t, nats, deps.Module+"/cmd/worker") {
		if !underAny(p, deps.Module+"/bootstrap", "github.com/nats-io") {
			t.Errorf("%s imports %s: in a worker only bootstrap may", p, nats)
		}
	}
}

// The fake NCCL is chosen explicitly, never linked in for its side effects:
// among the module's packages (test files not read), only job imports
// collective/ncclfake, for sim devices under MESHRUN_NCCL_LIBRARY=fake, and
// packages that exist for tests (a name ending in "test") may.
func TestLayeringNCCLFake(t *testing.T) {
	fake := deps.Module + "/collective/ncclfake"
	for _, p := range deps.Importers(t, fake, deps.Module+"/...") {
		name := p[strings.LastIndex(p, "/")+1:]
		if p != deps.Module+"/job" && !strings.HasSuffix(name, "test") {
			t.Errorf("%s imports %s: only job (the sim path) and test helpers may", p, fake)
		}
	}
	if got := deps.Importers(t, fake, deps.Module+"/cmd/worker"); !slices.Equal(got, []string{deps.Module + "/job"}) {
		t.Errorf("in the worker, %s is imported by %v, want job's sim path only", fake, got)
	}
}

// Nothing of the collective layer registers itself: the packages that hold
// the backends, the transports and the fake library, and job, which chooses
// among them, declare no init function (test files aside).
func TestNoInit(t *testing.T) {
	for _, dir := range []string{"../collective", "../collective/nccl", "../collective/ncclfake", "../transport", ".", "../job"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
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
			for _, d := range af.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == "init" {
					t.Errorf("%s: func init: list a backend where a World is made, do not register it", fset.Position(fd.Pos()))
				}
			}
		}
	}
}

func underAny(p string, roots ...string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}
