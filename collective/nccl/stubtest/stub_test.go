//go:build !cuda

package stubtest_test

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBinding builds the stand-in libraries and the cuda-tagged tests of
// this package, and runs those against the stand-ins: the calls and their
// arguments (TestBindingCalls), an asynchronous error (TestBindingAsyncError)
// and the libraries the binding refuses (TestBindingRefused: too old, a
// function missing, no file). It never skips: without gcc or cgo it fails.
func TestBinding(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Fatalf("gcc, which builds the stand-in libraries and the binding (cgo): %v", err)
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, which builds the cuda-tagged tests: %v", err)
	}
	dir := t.TempDir()
	// cc compiles testdata/src into the shared library out, its soname
	// out's name.
	cc := func(out, src string, flags ...string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"-shared", "-fPIC", "-Wall", "-Werror", "-Wl,-soname," + filepath.Base(out), "-o", out, filepath.Join("testdata", src)}, flags...)
		if b, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, b)
		}
	}
	lib := driverStub(t, cc)
	libs := map[string]string{}
	for name, flags := range map[string][]string{"current": nil, "old": {"-DSTUB_VERSION=20903"}, "nogroupend": {"-DSTUB_OMIT_GROUPEND"}} {
		libs[name] = filepath.Join(dir, name, "libnccl.so.2")
		cc(libs[name], "libnccl.c", flags...)
	}

	bin := filepath.Join(dir, "binding.test")
	build := exec.Command(goTool, "test", "-tags", "cuda", "-c", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_LDFLAGS=-L"+lib+" "+os.Getenv("CGO_LDFLAGS"))
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -tags cuda -c: %v\n%s", err, b)
	}
	// The binary needs nothing more of the driver than the stand-in has.
	ldd := exec.Command("ldd", "-r", bin)
	ldd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib)
	if b, err := ldd.CombinedOutput(); err != nil || strings.Contains(string(b), "not found") || strings.Contains(string(b), "undefined symbol") ||
		!strings.Contains(string(b), filepath.Join(lib, "libcuda.so.1")) {
		t.Fatalf("ldd -r %s: %v\n%s", bin, err, b)
	}

	for _, r := range []struct {
		name, lib, tests, refusal string
	}{
		{"calls", libs["current"], "TestBindingCalls|TestBindingAsyncError", ""},
		{"old", libs["old"], "TestBindingRefused", "NCCL 20903 is older than 2.10"},
		{"nogroupend", libs["nogroupend"], "TestBindingRefused", "undefined symbol ncclGroupEnd (NCCL 2.10 or later needed)"},
		{"missing", filepath.Join(dir, "none", "libnccl.so.2"), "TestBindingRefused", "libnccl.so.2: cannot open shared object file"},
	} {
		t.Run(r.name, func(t *testing.T) {
			cmd := exec.Command(bin, "-test.v", "-test.count=1", "-test.timeout=2m", "-test.run", "^("+r.tests+")$")
			cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+lib, "MESHRUN_NCCL_LIBRARY="+r.lib,
				"MESHRUN_NCCL_STUB=1", "MESHRUN_NCCL_STUB_REFUSAL="+r.refusal)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
			}
			for _, name := range strings.Split(r.tests, "|") {
				if !strings.Contains(string(out), "--- PASS: "+name+" ") {
					t.Errorf("%s did not pass (skipped or not run):\n%s", name, out)
				}
			}
			t.Logf("%s", out)
		})
	}
}

// driverStub returns the directory of the stand-in driver (libcuda.so.1,
// and libcuda.so for -lcuda). The cuda-tagged build links it, and the go
// command's cache keeps the build while CGO_LDFLAGS names the same
// directory: it is kept, one per version of libcuda.c, under the module's
// .cache (ignored by git), made in a directory of its own and renamed into
// place whole.
func driverStub(t *testing.T, cc func(out, src string, flags ...string)) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", "libcuda.c"))
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs(filepath.Join("..", "..", "..", ".cache"))
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(root, fmt.Sprintf("nccl-stubtest-%x", sha256.Sum256(src))[:40])
	if _, err := os.Stat(filepath.Join(lib, "libcuda.so")); err == nil {
		return lib
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(root, "nccl-stubtest-tmp-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	cc(filepath.Join(tmp, "libcuda.so.1"), "libcuda.c")
	if err := os.Symlink("libcuda.so.1", filepath.Join(tmp, "libcuda.so")); err != nil { // what -lcuda links
		t.Fatal(err)
	}
	if err := os.Rename(tmp, lib); err != nil { // another run's may be there already
		if _, serr := os.Stat(filepath.Join(lib, "libcuda.so")); serr != nil {
			t.Fatal(err)
		}
	}
	return lib
}
