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
func (p *partial) Gemm(g kernels.GemmParams, o kernels.GemmOperands) error {
	p.calls++
	return p.Provider.Gemm(g, o)
}

// other is a provider of another device.
type other struct{ *partial }

func (other) Name() string              { return "other" }
func (other) Device() tensor.DeviceKind { return tensor.Sim }

func newRegistry(t *testing.T, part *partial) *kernels.Registry {
	r := kernels.NewRegistry()
	if err := r.Register("cpu", func() (kernels.Provider, error) { return cpu.New(cpu.Options{}) }); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("partial", func() (kernels.Provider, error) { return part, nil }); err != nil {
		t.Fatal(err)
	}
	if err := r.Register("other", func() (kernels.Provider, error) { return other{part}, nil }); err != nil {
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

func TestDispatcherLogsEachOpOnce(t *testing.T) {
	part := &partial{}
	part.Provider, _ = cpu.New(cpu.Options{})
	var logs []string
	logf := func(msg string, kv ...any) { logs = append(logs, msg+fmt.Sprint(kv...)) }
	d, err := newRegistry(t, part).NewDispatcher(kernels.Choice{Default: "partial"}, logf)
	if err != nil {
		t.Fatal(err)
	}
	if len(logs) != 0 {
		t.Fatalf("logged before any call: %v", logs)
	}
	if got := d.Provider(kernels.OpGemm).Name(); got != "partial" {
		t.Errorf("gemm served by %s", got)
	}
	if got := d.Provider(kernels.OpGemmBias).Name(); got != "cpu" {
		t.Errorf("gemm_bias served by %s", got)
	}
	x, _ := tensor.FromFloat32([]float32{1, 2}, 1, 2)
	w, _ := tensor.FromFloat32([]float32{3, 4, 5, 6}, 2, 2)
	b, _ := tensor.FromFloat32([]float32{1, 1}, 2)
	y := tensor.New(tensor.Float32, 1, 2)
	for range 3 {
		if err := kernels.LinearForward(d, y, x, w, nil); err != nil {
			t.Fatal(err)
		}
		if err := kernels.LinearForward(d, y, x, w, b); err != nil {
			t.Fatal(err)
		}
	}
	if part.calls != 3 || y.Float32()[0] != 12 || y.Float32()[1] != 18 {
		t.Errorf("calls=%d y=%v", part.calls, y.Float32())
	}
	// One line per op, naming the provider and why: the fallback says what the
	// chosen provider lacks.
	if len(logs) != 2 || !strings.Contains(logs[0], "partial") || !strings.Contains(logs[1], "fallback: partial lacks gemm_bias") {
		t.Errorf("logs:\n%s", strings.Join(logs, "\n"))
	}
	if d.DeviceKind() != tensor.CPU || d.Device().Kind != tensor.CPU {
		t.Errorf("device %v", d.DeviceKind())
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
	if d.Provider(kernels.OpGemm).Name() != "partial" || d.Provider(kernels.OpGemv).Name() != "cpu" {
		t.Error("per-op choice not honoured")
	}
	if _, err := r.NewDispatcher(kernels.Choice{Default: "nosuch"}, nil); !errors.Is(err, kernels.ErrUnknownProvider) {
		t.Errorf("unknown provider: %v", err)
	}
	// A provider of another device in the same choice is refused.
	c, _ = kernels.ParseChoice("cpu,gemm=other")
	if _, err := r.NewDispatcher(c, nil); !errors.Is(err, kernels.ErrDevice) {
		t.Errorf("providers of two devices: %v", err)
	}
	// A device without its default provider ("sim") is refused.
	if _, err := r.NewDispatcher(kernels.Choice{Default: "other"}, nil); err == nil || !strings.Contains(err.Error(), "sim") {
		t.Errorf("device without its default provider: %v", err)
	}
	// A tensor of another device is an error, not a silent detour to the host.
	dev := &fakeBuf{}
	y, _ := tensor.OnDevice(dev, tensor.Float32, 2)
	x := tensor.New(tensor.Float32, 2)
	if err := d.GeluForward(y, x); !errors.Is(err, kernels.ErrDevice) {
		t.Errorf("sim tensor on a cpu dispatcher: %v", err)
	}
}

// fakeBuf is a buffer of a device nobody computes on.
type fakeBuf struct{}

func (*fakeBuf) Memory() tensor.Memory { return fakeMem{} }
func (*fakeBuf) Len() int              { return 1 << 10 }

type fakeMem struct{ tensor.Memory }

func (fakeMem) Device() tensor.Device { return tensor.Device{Kind: tensor.Sim} }

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
	if err := kernels.LinearForward(d, y, x, w, b); err != nil {
		panic(err)
	}
	fmt.Println(y.Float32())
	// Output: [11 25]
}
