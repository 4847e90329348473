package errstyle

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/bootstrap/natsconn/creds"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/launch/cudadriver"
	"github.com/meshrun/meshrun/linear/layout"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// TestSentinelMessages checks errors the packages return against the error
// style: each wraps its sentinel, starts with the sentinel's message
// ("PKG: what") and names its package once.
func TestSentinelMessages(t *testing.T) {
	first := func(_ any, err error) error { return err }
	mesh4 := placement.MustMesh([]int{4}, nil)
	spec := func(s string) placement.Spec {
		sp, err := placement.ParseSpec(s, mesh4)
		if err != nil {
			t.Fatal(err)
		}
		return sp
	}
	badModel := strings.NewReader(`{"alpha": -1}`)
	openCreds := filepath.Join(t.TempDir(), "open.creds")
	if err := os.WriteFile(openCreds, []byte("user=a\npassword=b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(openCreds, 0o644); err != nil {
		t.Fatal(err)
	}
	_, noDriver := cudadriver.Count(filepath.Join(t.TempDir(), "libcuda.so.1"))

	for _, tc := range []struct {
		name string
		pkg  string
		err  error
		is   error
	}{
		{"placement: empty mesh", "placement", first(placement.ParseMesh("")), placement.ErrSyntax},
		{"placement: a bad size in a mesh", "placement", first(placement.ParseMesh("4xq")), placement.ErrSyntax},
		{"placement: a named mesh's bad size", "placement", first(placement.ParseMesh("dp=0")), placement.ErrSyntax},
		{"placement: a mesh too large", "placement", first(placement.ParseMesh("1000000x1000000")), placement.ErrTooLarge},
		{"placement: a duplicate dim name", "placement", first(placement.ParseMesh("dp=2,dp=2")), placement.ErrInvalid},
		{"placement: a bad reduce op", "placement", first(placement.Parse("P(foo)")), placement.ErrSyntax},
		{"placement: a bad list", "placement", first(placement.ParseList("[S(0)")), placement.ErrSyntax},
		{"placement: a bad shape", "placement", first(placement.ParseSpec("8xq:[R]", mesh4)), placement.ErrSyntax},
		{"placement: a spec without shape", "placement", first(placement.ParseSpec("[R]", mesh4)), placement.ErrSyntax},
		{"placement: a shard of a missing dim", "placement", first(placement.ParseSpec("8:[S(1)]", mesh4)), placement.ErrInvalid},
		{"placement: world size", "placement", mesh4.Validate(3), placement.ErrWorldSize},
		{"placement: S -> P", "placement", first(placement.Plan(spec("8:[S(0)]"), spec("8:[P]"))), placement.ErrNoPath},
		{"placement: a bad model", "placement", first(placement.DecodeModel(badModel, "model.json")), placement.ErrInvalid},
		{"spmd: an unknown op", "spmd", first(spmd.Forward(spmd.Request{Op: "nope"})), spmd.ErrNoRule},
		{"spmd: shapes that do not fit", "spmd", first(spmd.Forward(spmd.Request{Op: "linear_nobias", Inputs: []spmd.Operand{
			{Name: "x", Spec: spec("8x16:[R]")}, {Name: "w", Spec: spec("32x15:[R]")}}})), spmd.ErrShape},
		{"tensor: data that does not fit the shape", "tensor", first(tensor.FromFloat32([]float32{1, 2, 3}, 2, 2)), tensor.ErrShape},
		{"tensor: a bad npy stream", "tensor", first(tensor.ReadNpy(bytes.NewReader([]byte("not npy")))), tensor.ErrFormat},
		{"kernels: a bad gemm", "tensor", kernels.GemmParams{M: -1, N: 2, K: 3, BatchCount: 1, DType: tensor.Float32}.Validate(), kernels.ErrShape},
		{"kernels: an unknown provider", "kernels", first(kernels.NewRegistry().NewDispatcher(kernels.Choice{Default: "nope"}, nil)), kernels.ErrUnknownProvider},
		{"layout: an unknown preset", "layout", first(layout.Preset("nope", mesh4, 8, 16, 32, false)), layout.ErrUnknown},
		{"creds: a garbled file", "creds", first(creds.Parse([]byte("user\n"))), creds.ErrFormat},
		{"creds: a file others read", "creds", first(creds.Read(openCreds)), creds.ErrFormat},
		{"cudadriver: no driver", "cudadriver", noDriver, cudadriver.ErrNoDriver},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.pkg == "cudadriver" && !errors.Is(tc.err, tc.is) {
				t.Skipf("built without cgo: %v", tc.err)
			}
			if !errors.Is(tc.err, tc.is) {
				t.Fatalf("%v: want an error wrapping %q", tc.err, tc.is)
			}
			msg := tc.err.Error()
			if !strings.HasPrefix(msg, tc.is.Error()) {
				t.Errorf("%q: want it to start with %q", msg, tc.is.Error())
			}
			if n := strings.Count(msg, tc.pkg+": "); n != 1 {
				t.Errorf("%q names %q %d times, want once", msg, tc.pkg+": ", n)
			}
		})
	}
}
