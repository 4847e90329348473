package deploy

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The CUDA libraries gpu.sh looks for, with the function each stand-in of
// the tests defines: it returns the stand-in's id, so that a program linked
// the way gpu.sh links says which file the loader gave it.
var fakeFuncs = map[string]string{
	"libcuda":     "int cuInit(unsigned int f) { return ID; }",
	"libcublas":   "int cublasCreate_v2(void **h) { return ID; }",
	"libcublasLt": "int cublasLtCreate(void **h) { return ID; }",
	"libnccl":     "int ncclGetVersion(int *v) { *v = ID; return 0; }",
}

// fakeLibs builds stand-in libraries: fakeLib(path, id) writes at path a
// shared library with the soname of path's name (or soname when given).
type fakeLibs struct {
	t   *testing.T
	src string
}

func newFakeLibs(t *testing.T) *fakeLibs {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gpu.sh's library search: no gcc to build stand-in libraries")
	}
	if _, err := exec.LookPath("readelf"); err != nil {
		t.Skip("gpu.sh's library search: no readelf to read what the linker recorded")
	}
	dir := t.TempDir()
	for base, fn := range fakeFuncs {
		if err := os.WriteFile(filepath.Join(dir, base+".c"), []byte(fn+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return &fakeLibs{t, dir}
}

// lib writes path, a stand-in for the library its name says (libcublas.so.13:
// libcublas) with that soname, or with soname when given.
func (f *fakeLibs) lib(path string, id int, soname ...string) {
	f.t.Helper()
	name := filepath.Base(path)
	base := name[:strings.Index(name, ".so")]
	so := name
	if len(soname) > 0 {
		so = soname[0]
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		f.t.Fatal(err)
	}
	cmd := exec.Command("gcc", "-shared", "-fPIC", fmt.Sprintf("-DID=%d", id), "-Wl,-soname,"+so, "-o", path, filepath.Join(f.src, base+".c"))
	if out, err := cmd.CombinedOutput(); err != nil {
		f.t.Fatalf("gcc %s: %v\n%s", path, err, out)
	}
}

// gpuEnv is the environment gpu.sh runs in for the tests: this process's,
// less the settings gpu.sh reads, with fake ldconfig and python3 first in
// PATH (they list $FAKE_LDCACHE's files as the loader cache and print
// $FAKE_SITE as python3's site-packages), plus the given settings.
func gpuEnv(t *testing.T, tools string, settings ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "LD_LIBRARY_PATH", "MESHRUN_CUDA_LIBS", "MESHRUN_GPU_SYSROOT", "FAKE_LDCACHE", "FAKE_SITE":
		case "PATH":
			env = append(env, "PATH="+tools+":"+v)
		default:
			env = append(env, kv)
		}
	}
	return append(env, settings...)
}

// fakeTools writes the fake ldconfig and python3 into a directory.
func fakeTools(t *testing.T) string {
	dir := t.TempDir()
	ldconfig := `#!/bin/sh
[ "$1" = -p ] || exit 1
echo "libs found in cache"
[ -n "$FAKE_LDCACHE" ] || exit 0
for f in "$FAKE_LDCACHE"/lib*.so*; do
  [ -e "$f" ] && printf '\t%s (libc6,x86-64) => %s\n' "${f##*/}" "$f"
done
for f in "$FAKE_LDCACHE"/i386/lib*.so*; do
  [ -e "$f" ] && printf '\t%s (libc6) => %s\n' "${f##*/}" "$f"
done
exit 0
`
	python := "#!/bin/sh\n[ -z \"$FAKE_SITE\" ] || echo \"$FAKE_SITE\"\n"
	for name, s := range map[string]string{"ldconfig": ldconfig, "python3": python} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// gpuSh runs deploy/gpu.sh with env; it returns stdout, stderr and the exit code.
func gpuSh(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{"gpu.sh"}, args...)...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return stdout.String(), stderr.String(), cmd.ProcessState.ExitCode()
}

var foundRE = regexp.MustCompile(`(?m)^# (lib\S+)\s+(/\S+) \(`)

// found parses gpu.sh libs: soname -> file.
func found(out string) map[string]string {
	m := map[string]string{}
	for _, s := range foundRE.FindAllStringSubmatch(out, -1) {
		m[s[1]] = s[2]
	}
	return m
}

// TestGPULibs lays out stand-ins of the CUDA libraries as a machine has them
// (a driver under /usr/local/nvidia/lib64, toolkits under /usr/local/cuda-X.Y,
// PyTorch's wheels in a venv's and python3's site-packages, the loader cache,
// LD_LIBRARY_PATH, MESHRUN_CUDA_LIBS) and checks which file gpu.sh libs
// finds for each soname: the first directory in its search order that has
// the library wins, whatever versions come later.
func TestGPULibs(t *testing.T) {
	f := newFakeLibs(t)
	tools := fakeTools(t)
	r := t.TempDir()
	p := func(s string) string { return filepath.Join(r, s) }
	venv := "sys/opt/torch/.venv/lib/python3.12/site-packages/nvidia/"
	for _, l := range []struct {
		path string
		id   int
	}{
		{"sys/usr/local/nvidia/lib64/libcuda.so.1", 11},
		{"sys/usr/local/cuda-13.0/lib64/libcublas.so.13", 21},
		{"sys/usr/local/cuda-13.0/lib64/libcublasLt.so.13", 21},
		{"sys/usr/local/cuda-12.4/targets/x86_64-linux/lib/libcublas.so.12", 22},
		{"sys/usr/local/cuda-12.4/targets/x86_64-linux/lib/libcublasLt.so.12", 22},
		{venv + "cu13/lib/libcublas.so.13", 31},
		{venv + "cu13/lib/libcublasLt.so.13", 31},
		{venv + "cublas/lib/libcublas.so.12", 32},
		{venv + "cublas/lib/libcublasLt.so.12", 32},
		{venv + "nccl/lib/libnccl.so.2", 33},
		{"wheels/sys/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublas.so.13", 34},
		{"wheels/sys/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublasLt.so.13", 34},
		{"wheels/sys/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cublas/lib/libcublas.so.12", 35},
		{"wheels/sys/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cublas/lib/libcublasLt.so.12", 35},
		{"wheels/sys/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2", 36},
		{"py/site-packages/nvidia/cublas/lib/libcublas.so.12", 41},
		{"py/site-packages/nvidia/cublas/lib/libcublasLt.so.12", 41},
		{"cache/libcuda.so.1", 51},
		{"cache/libcublas.so.12", 51},
		{"cache/libcublasLt.so.12", 51},
		{"drivercache/libcuda.so.1", 52},
		{"drivercache/i386/libcuda.so.1", 99},
		{"m/libcuda.so.1", 61},
		{"m/libcublas.so.12", 61},
		{"m/libcublasLt.so.12", 61},
		{"monly/libcuda.so.1", 62},
		{"l/libcublas.so.13", 71},
		{"l/libcublasLt.so.13", 71},
		{"l2/libcublas.so.13", 72},
		{"l2/libcublas.so.9", 73},
	} {
		f.lib(p(l.path), l.id)
	}
	f.lib(p("badname/libcublas.so.13"), 81, "libcublas.so.12")
	f.lib(p("badname/libcublasLt.so.13"), 81)
	sys, wheels := "MESHRUN_GPU_SYSROOT="+p("sys"), "MESHRUN_GPU_SYSROOT="+p("wheels/sys")
	site, cache := "FAKE_SITE="+p("py/site-packages"), "FAKE_LDCACHE="+p("cache")
	nccl := p(venv + "nccl/lib/libnccl.so.2")

	for _, tc := range []struct {
		name     string
		settings []string
		want     map[string]string // soname -> file, "" for not found
		stderr   string
	}{
		{"MESHRUN_CUDA_LIBS wins outright", []string{"MESHRUN_CUDA_LIBS=" + p("m"), "LD_LIBRARY_PATH=" + p("l"), sys, site, cache},
			map[string]string{"libcuda.so.1": p("m/libcuda.so.1"), "libcublas.so.12": p("m/libcublas.so.12"), "libcublasLt.so.12": p("m/libcublasLt.so.12"), "libnccl.so.2": nccl}, ""},
		{"MESHRUN_CUDA_LIBS without cuBLAS: LD_LIBRARY_PATH next", []string{"MESHRUN_CUDA_LIBS=" + p("monly"), "LD_LIBRARY_PATH=" + p("l"), sys, site, cache},
			map[string]string{"libcuda.so.1": p("monly/libcuda.so.1"), "libcublas.so.13": p("l/libcublas.so.13"), "libcublasLt.so.13": p("l/libcublasLt.so.13")}, ""},
		{"LD_LIBRARY_PATH in order; cublasLt of cublas's version", []string{"LD_LIBRARY_PATH=" + p("l2") + "::" + p("l"), sys, site, cache},
			map[string]string{"libcuda.so.1": p("sys/usr/local/nvidia/lib64/libcuda.so.1"), "libcublas.so.13": p("l2/libcublas.so.13"), "libcublasLt.so.13": p("l/libcublasLt.so.13")}, ""},
		{"/usr/local/nvidia/lib64, then the loader cache, before the toolkit", []string{sys, site, cache},
			map[string]string{"libcuda.so.1": p("sys/usr/local/nvidia/lib64/libcuda.so.1"), "libcublas.so.12": p("cache/libcublas.so.12"), "libcublasLt.so.12": p("cache/libcublasLt.so.12")}, ""},
		{"the newest toolkit before the wheels", []string{sys, site},
			map[string]string{"libcublas.so.13": p("sys/usr/local/cuda-13.0/lib64/libcublas.so.13"), "libcublasLt.so.13": p("sys/usr/local/cuda-13.0/lib64/libcublasLt.so.13")}, ""},
		{"the cache's 64-bit driver; python3's wheels before the venv's", []string{wheels, site, "FAKE_LDCACHE=" + p("drivercache")},
			map[string]string{"libcuda.so.1": p("drivercache/libcuda.so.1"), "libcublas.so.12": p("py/site-packages/nvidia/cublas/lib/libcublas.so.12"),
				"libcublasLt.so.12": p("py/site-packages/nvidia/cublas/lib/libcublasLt.so.12")}, ""},
		{"the venv's cu13 before its cu12 wheels", []string{wheels, "FAKE_LDCACHE=" + p("drivercache")},
			map[string]string{"libcublas.so.13": p("wheels/sys/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublas.so.13"),
				"libcublasLt.so.13": p("wheels/sys/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcublasLt.so.13"),
				"libnccl.so.2":      p("wheels/sys/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2")}, ""},
		{"a SONAME that is not the file's name", []string{"MESHRUN_CUDA_LIBS=" + p("badname"), sys},
			map[string]string{"libcublas.so.13": p("badname/libcublas.so.13")}, "has SONAME 'libcublas.so.12', not libcublas.so.13"},
		{"nothing", []string{"MESHRUN_GPU_SYSROOT=" + p("none")}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, code := gpuSh(t, gpuEnv(t, tools, tc.settings...), "libs")
			got := found(stdout)
			for so, file := range tc.want {
				if got[so] != file {
					t.Errorf("%s: found %q, want %q", so, got[so], file)
				}
			}
			if tc.stderr != "" && !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tc.stderr, stderr)
			}
			if tc.want == nil {
				if code == 0 || len(got) != 0 || !strings.Contains(stdout, "libcuda.so.1       not found") {
					t.Errorf("nothing to find: exit %d, found %v\n%s", code, got, stdout)
				}
				return
			}
			if code != 0 {
				t.Errorf("exit %d\n%s%s", code, stdout, stderr)
			}
			// The settings it prints name every directory it found a library in.
			var dirs []string
			for _, file := range got {
				dirs = append(dirs, filepath.Dir(file))
			}
			ld := regexp.MustCompile(`(?m)^export LD_LIBRARY_PATH=([^"\s]+)"`).FindStringSubmatch(stdout)
			if ld == nil {
				t.Fatalf("no LD_LIBRARY_PATH line:\n%s", stdout)
			}
			for _, d := range dirs {
				if !slices.Contains(strings.Split(ld[1], ":"), d) {
					t.Errorf("LD_LIBRARY_PATH %s lacks %s", ld[1], d)
				}
			}
			if n, ok := got["libnccl.so.2"]; ok && !strings.Contains(stdout, "export MESHRUN_NCCL_LIBRARY="+n+"\n") {
				t.Errorf("no MESHRUN_NCCL_LIBRARY=%s:\n%s", n, stdout)
			}
		})
	}

	t.Run("link", func(t *testing.T) {
		env := gpuEnv(t, tools, wheels, "FAKE_LDCACHE="+p("drivercache"))
		cu13 := p("wheels/sys/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib")
		bin := linkProgram(t, env, filepath.Join(t.TempDir(), "link"))
		needed, runpath := dynamic(t, bin)
		for _, so := range []string{"libcuda.so.1", "libcublas.so.13", "libcublasLt.so.13"} {
			if !slices.Contains(needed, so) {
				t.Errorf("NEEDED %v lacks %s", needed, so)
			}
		}
		for _, d := range []string{p("drivercache"), cu13} {
			if !slices.Contains(runpath, d) {
				t.Errorf("RUNPATH %v lacks %s", runpath, d)
			}
		}
		// Run with no LD_LIBRARY_PATH: the loader finds each soname through
		// the rpath, in the directory gpu.sh found it in (the ids say which).
		run := exec.Command(bin)
		run.Env = gpuEnv(t, tools)
		out, err := run.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "52 34 34" {
			t.Errorf("the linked program: %v, %q; want the ids 52 34 34 (the cache's driver, the venv's cu13 cuBLAS)", err, out)
		}
		// check: ldd of it with the settings of libs; a binary needing a
		// library this machine lacks fails.
		stdout, stderr, code := gpuSh(t, env, "check", bin)
		if code != 0 || !strings.Contains(stdout, "libcublas.so.13 => "+cu13+"/libcublas.so.13") {
			t.Errorf("check: exit %d\n%s%s", code, stdout, stderr)
		}
		// A binary whose libraries are gone (linked against a tree since
		// removed, nothing else to find) fails the check.
		gone := filepath.Join(t.TempDir(), "gone")
		for _, so := range []string{"libcuda.so.1", "libcublas.so.13", "libcublasLt.so.13"} {
			f.lib(filepath.Join(gone, so), 1)
		}
		none := gpuEnv(t, tools, "MESHRUN_GPU_SYSROOT="+p("none"))
		orphan := linkProgram(t, append(none, "MESHRUN_CUDA_LIBS="+gone), filepath.Join(t.TempDir(), "link"))
		if err := os.RemoveAll(gone); err != nil {
			t.Fatal(err)
		}
		stdout, stderr, code = gpuSh(t, none, "check", orphan)
		if code == 0 || !strings.Contains(stderr, "libcuda.so.1 libcublas.so.13 libcublasLt.so.13 not found") {
			t.Errorf("check without the libraries: exit %d\n%s%s", code, stdout, stderr)
		}
		_, stderr, code = gpuSh(t, none, "link", filepath.Join(t.TempDir(), "link"))
		if code == 0 || !strings.Contains(stderr, "libcuda.so.1 (the NVIDIA driver) not found") {
			t.Errorf("link without the libraries: exit %d\n%s", code, stderr)
		}
	})
}

// linkProgram links the small program of buildLinked against the libraries
// gpu.sh link finds (env) and returns the binary.
func linkProgram(t *testing.T, env []string, linkDir string) string {
	t.Helper()
	stdout, stderr, code := gpuSh(t, env, "link", linkDir)
	m := regexp.MustCompile(`(?m)^CGO_LDFLAGS='(.*)'$`).FindStringSubmatch(stdout)
	if code != 0 || m == nil {
		t.Fatalf("gpu.sh link: exit %d\n%s%s", code, stdout, stderr)
	}
	for _, l := range []string{"libcuda.so", "libcublas.so", "libcublasLt.so"} {
		if _, err := os.Stat(filepath.Join(linkDir, l)); err != nil {
			t.Errorf("gpu.sh link: %v", err)
		}
	}
	return buildLinked(t, m[1])
}

// dynamic returns a binary's NEEDED entries and its RUNPATH's directories.
func dynamic(t *testing.T, bin string) (needed, runpath []string) {
	t.Helper()
	out, err := exec.Command("readelf", "-d", bin).Output()
	if err != nil {
		t.Fatalf("readelf -d %s: %v", bin, err)
	}
	for _, m := range regexp.MustCompile(`\((NEEDED|RUNPATH|RPATH)\).*\[(.*)\]`).FindAllStringSubmatch(string(out), -1) {
		if m[1] == "NEEDED" {
			needed = append(needed, m[2])
		} else {
			runpath = append(runpath, strings.Split(m[2], ":")...)
		}
	}
	return needed, runpath
}

// TestGPUStubs: the stand-ins prebuild links against carry the machine's
// sonames (CUDA 13's by default), every function of Debian's CUDA 11.8 link
// stubs and no symbol versions, and a program linked against them needs
// those sonames. It needs the CUDA 11.8 package that .ci/checks.d/cuda.sh
// fetches into .cache/cuda.
func TestGPUStubs(t *testing.T) {
	cache := os.Getenv("MESHRUN_CUDA_CACHE")
	if cache == "" {
		cache = filepath.Join("..", ".cache", "cuda")
	}
	if debs, _ := filepath.Glob(filepath.Join(cache, "nvidia-cuda-dev_*.deb")); len(debs) == 0 {
		t.Skipf("no CUDA 11.8 package in %s: .ci/checks.d/cuda.sh fetches it", cache)
	}
	newFakeLibs(t) // skips without gcc or readelf
	if _, err := exec.LookPath("nm"); err != nil {
		t.Skip("no nm")
	}
	dir := t.TempDir()
	env := gpuEnv(t, fakeTools(t))
	if stdout, stderr, code := gpuSh(t, env, "stubs", dir, "13"); code != 0 {
		t.Fatalf("gpu.sh stubs: exit %d\n%s%s", code, stdout, stderr)
	}
	for _, so := range []string{"libcuda.so.1", "libcublas.so.13", "libcublasLt.so.13"} {
		file := filepath.Join(dir, so)
		d, err := exec.Command("readelf", "-d", "-V", file).Output()
		if err != nil {
			t.Fatalf("readelf %s: %v", file, err)
		}
		if !strings.Contains(string(d), "Library soname: ["+so+"]") {
			t.Errorf("%s: SONAME is not %s", file, so)
		}
		if strings.Contains(string(d), "Version definition section") {
			t.Errorf("%s defines symbol versions", file)
		}
		deb := filepath.Join(filepath.Dir(mustGlob(t, filepath.Join(cache, "root", "usr", "lib", "*", "stubs", "libcuda.so"))), so[:strings.Index(so, ".so")]+".so")
		if n, want := functions(t, file), functions(t, deb); n != want || n < 100 {
			t.Errorf("%s: %d functions, Debian's stub %d", file, n, want)
		}
	}
	bin := buildLinked(t, "-L"+dir)
	needed, _ := dynamic(t, bin)
	for _, so := range []string{"libcuda.so.1", "libcublas.so.13", "libcublasLt.so.13"} {
		if !slices.Contains(needed, so) {
			t.Errorf("NEEDED %v lacks %s", needed, so)
		}
	}
}

func mustGlob(t *testing.T, pattern string) string {
	t.Helper()
	m, _ := filepath.Glob(pattern)
	if len(m) == 0 {
		t.Fatalf("no %s", pattern)
	}
	return m[0]
}

// functions counts the functions a shared library defines.
func functions(t *testing.T, lib string) int {
	t.Helper()
	out, err := exec.Command("nm", "-D", "--defined-only", lib).Output()
	if err != nil {
		t.Fatalf("nm %s: %v", lib, err)
	}
	return len(regexp.MustCompile(`(?m) [TW] `).FindAllIndex(out, -1))
}

// buildLinked builds a small cgo program linked with -lcuda -lcublas
// -lcublasLt, as kernels/cuda and gorgonia.org/cu are, with CGO_LDFLAGS
// ldflags, and returns the binary. It prints what each library's function
// returns.
func buildLinked(t *testing.T, ldflags string) string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	src := t.TempDir()
	prog := `package main

/*
#cgo LDFLAGS: -lcuda -lcublas -lcublasLt
int cuInit(unsigned int);
int cublasCreate_v2(void **);
int cublasLtCreate(void **);
*/
import "C"

import "fmt"

func main() { fmt.Println(C.cuInit(0), C.cublasCreate_v2(nil), C.cublasLtCreate(nil)) }
`
	for name, s := range map[string]string{"go.mod": "module linked\n\ngo 1.21\n", "main.go": prog} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(src, "linked")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_LDFLAGS="+ldflags, "GOFLAGS=", "GOWORK=off", "GOTOOLCHAIN=local")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build with CGO_LDFLAGS=%s: %v\n%s", ldflags, err, out)
	}
	return bin
}
