package kernels_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/cpu"
	"github.com/meshrun/meshrun/tensor"
)

// partial is a provider that only has Gemm and counts its calls.
type partial struct {
	*cpu.Provider
	calls int
}

func (p *partial) Name() string { return "partial" }
func (p *partial) Has(op kernels.Op) bool {
	return op == kernels.OpGemm
}
func (p *partial) Gemm(g kernels.GemmParams, a, b, c *tensor.Tensor) error {
	p.calls++
	return p.Provider.Gemm(g, a, b, c)
}

func newRegistry(t *testing.T, part *partial) *kernels.Registry {
	r := kernels.NewRegistry()
	if err := r.Register("cpu", func() (kernels.Provider, error) { return cpu.New(cpu.Options{}) }); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("partial", func() (kernels.Provider, error) { return part, nil }); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("cpu", func() (kernels.Provider, error) { return nil, nil }); err == nil {
		t.Fatal("duplicate registration accepted")
	}
	return r
}

func TestParseChoice(t *testing.T) {
	for _, tc := range []struct {
		in, out string
		err     bool
	}{
		{"cpu", "cpu", false},
		{"openblas,gemm=cpu", "openblas,gemm=cpu", false},
		{"cuda, gelu_forward = cpu ,gemv=openblas", "cuda,gemv=openblas,gelu_forward=cpu", false},
		{"cpu,nosuchop=cpu", "", true},
		{"", "", true},
		{"cpu,openblas", "", true},
	} {
		c, err := kernels.ParseChoice(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("%q: err = %v", tc.in, err)
			continue
		}
		if err == nil && c.String() != tc.out {
			t.Errorf("%q: String() = %q, want %q", tc.in, c.String(), tc.out)
		}
	}
}

func TestDispatcherFallbackLoggedOnce(t *testing.T) {
	part := &partial{}
	part.Provider, _ = cpu.New(cpu.Options{})
	var logs []string
	logf := func(msg string, kv ...any) { logs = append(logs, msg+fmt.Sprint(kv...)) }
	d, err := newRegistry(t, part).NewDispatcher(kernels.Choice{Default: "partial"}, logf)
	if err != nil {
		t.Fatal(err)
	}
	// Every op but gemm falls back, and each fallback is logged once.
	if len(logs) != len(kernels.Ops())-1 {
		t.Fatalf("%d log lines, want %d:\n%s", len(logs), len(kernels.Ops())-1, strings.Join(logs, "\n"))
	}
	if got := d.Provider(tensor.CPU, kernels.OpGemm).Name(); got != "partial" {
		t.Errorf("gemm served by %s", got)
	}
	if got := d.Provider(tensor.CPU, kernels.OpLinearForward).Name(); got != "cpu" {
		t.Errorf("linear_forward served by %s", got)
	}
	x, _ := tensor.FromFloat32([]float32{1, 2}, 1, 2)
	w, _ := tensor.FromFloat32([]float32{3, 4, 5, 6}, 2, 2)
	y := tensor.New(tensor.Float32, 1, 2)
	if err := d.Gemm(kernels.GemmParams{TransB: true, M: 1, N: 2, K: 2, Alpha: 1, DType: tensor.Float32}, x, w, y); err != nil {
		t.Fatal(err)
	}
	if err := d.LinearForward(y, x, w, nil); err != nil {
		t.Fatal(err)
	}
	if part.calls != 1 || y.Float32()[0] != 11 || y.Float32()[1] != 17 {
		t.Errorf("calls=%d y=%v", part.calls, y.Float32())
	}
	if len(logs) != len(kernels.Ops())-1 {
		t.Errorf("calls logged again")
	}
}

func TestDispatcherPerOpAndErrors(t *testing.T) {
	part := &partial{}
	part.Provider, _ = cpu.New(cpu.Options{})
	r := newRegistry(t, part)
	c, _ := kernels.ParseChoice("cpu,gemm=partial")
	d, err := r.NewDispatcher(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Provider(tensor.CPU, kernels.OpGemm).Name() != "partial" || d.Provider(tensor.CPU, kernels.OpGemv).Name() != "cpu" {
		t.Error("per-op choice not honoured")
	}
	if d.Provider(tensor.CUDA, kernels.OpGemm) != nil {
		t.Error("cuda route without a cuda provider")
	}
	if _, err := r.NewDispatcher(kernels.Choice{Default: "nosuch"}, nil); !errors.Is(err, kernels.ErrUnknownProvider) {
		t.Errorf("unknown provider: %v", err)
	}
}

func TestGemmParamsValidate(t *testing.T) {
	p := kernels.GemmParams{M: -1, N: 2, K: 3, LDA: 1, LDB: 1, LDC: 1, BatchCount: 1, DType: tensor.Float32}
	err := p.Validate()
	if !errors.Is(err, kernels.ErrShape) || !strings.Contains(err.Error(), "LDA") || !strings.Contains(err.Error(), "negative") {
		t.Errorf("want every problem reported, got %v", err)
	}
	q := kernels.GemmParams{TransA: true, M: 3, N: 4, K: 5, BatchCount: 2, DType: tensor.Float64}.Normalized()
	if q.LDA != 3 || q.LDB != 4 || q.LDC != 4 || q.StrideA != 15 || q.StrideB != 20 || q.StrideC != 12 {
		t.Errorf("normalized %+v", q)
	}
	if la, lb, lc := q.Lens(); la != 30 || lb != 40 || lc != 24 {
		t.Errorf("lens %d %d %d", la, lb, lc)
	}
	if q.Flops() != 2*3*4*5*2 {
		t.Errorf("flops %v", q.Flops())
	}
}

func ExampleDispatcher() {
	r := kernels.NewRegistry()
	_ = r.Register("cpu", func() (kernels.Provider, error) { return cpu.New(cpu.Options{}) })
	d, err := r.NewDispatcher(kernels.Choice{Default: "cpu"}, nil)
	if err != nil {
		panic(err)
	}
	x, _ := tensor.FromFloat32([]float32{1, 2, 3}, 1, 3)          // x[M=1, K=3]
	w, _ := tensor.FromFloat32([]float32{1, 0, 0, 0, 1, 1}, 2, 3) // w[N=2, K=3]
	b, _ := tensor.FromFloat32([]float32{10, 20}, 2)
	y := tensor.New(tensor.Float32, 1, 2)
	if err := d.LinearForward(y, x, w, b); err != nil {
		panic(err)
	}
	fmt.Println(y.Float32())
	// Output: [11 25]
}
