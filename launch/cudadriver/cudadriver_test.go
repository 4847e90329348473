//go:build cgo

package cudadriver_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/launch/cudadriver"
)

// TestNoDriver: a driver that cannot be loaded is ErrNoDriver, with the
// loader's reason and the library's name.
func TestNoDriver(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "libcuda.so.1")
	_, err := cudadriver.Count(lib)
	if !errors.Is(err, cudadriver.ErrNoDriver) {
		t.Fatalf("Count(%s): %v, want ErrNoDriver", lib, err)
	}
	for _, want := range []string{lib, "cannot open shared object file", "no NVIDIA driver on this machine"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	// The machine's own driver, by soname, as the launcher asks for it.
	n, err := cudadriver.Count("")
	if err == nil {
		t.Skipf("this machine has the driver (%d GPUs)", n)
	}
	if !errors.Is(err, cudadriver.ErrNoDriver) || !strings.HasPrefix(err.Error(), "cudadriver: no NVIDIA driver on this machine: libcuda.so.1: ") {
		t.Errorf("Count without a driver: %v", err)
	}
}

// fakeDriver builds testdata/fakecuda.c into dir/libcuda.so.1.
func fakeDriver(t *testing.T, dir string) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc to build a stand-in driver")
	}
	lib := filepath.Join(dir, "libcuda.so.1")
	out, err := exec.Command("gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", lib, "testdata/fakecuda.c").CombinedOutput()
	if err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return lib
}

// TestCount: the devices a driver reports; none when cuInit finds no device;
// cuInit's other errors by name.
func TestCount(t *testing.T) {
	lib := fakeDriver(t, t.TempDir())
	for _, tc := range []struct {
		init, devices string
		want          int
		err           string
	}{
		{"0", "3", 3, ""},
		{"0", "0", 0, ""},
		{"100", "3", 0, ""},
		{"999", "3", 0, "cuInit: CUDA_ERROR_UNKNOWN (999)"},
		{"3", "3", 0, "cuInit: CUDA error 3"},
	} {
		t.Setenv("FAKE_CUDA_INIT", tc.init)
		t.Setenv("FAKE_CUDA_DEVICES", tc.devices)
		n, err := cudadriver.Count(lib)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err || errors.Is(err, cudadriver.ErrNoDriver) {
				t.Errorf("cuInit %s: %d, %v; want %q", tc.init, n, err, tc.err)
			}
			continue
		}
		if err != nil || n != tc.want {
			t.Errorf("cuInit %s, %s devices: %d, %v; want %d", tc.init, tc.devices, n, err, tc.want)
		}
	}
}

// TestNotADriver: a library without the driver's functions is refused.
func TestNotADriver(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc")
	}
	dir := t.TempDir()
	src, lib := filepath.Join(dir, "x.c"), filepath.Join(dir, "libx.so")
	if err := os.WriteFile(src, []byte("int x(void) { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	if _, err := cudadriver.Count(lib); err == nil || !strings.Contains(err.Error(), "not the NVIDIA driver") {
		t.Errorf("Count(%s): %v", lib, err)
	}
}
