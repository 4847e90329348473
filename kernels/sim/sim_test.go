package sim_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/kerneltest"
	"github.com/meshrun/meshrun/kernels/sim"
	"github.com/meshrun/meshrun/tensor"
)

func TestConformance(t *testing.T) {
	p, err := sim.New(sim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	kerneltest.Run(t, kerneltest.Config{
		New: func(threads int) (kernels.Kernels, error) {
			if threads == 0 {
				return p, nil
			}
			return sim.New(sim.Options{Threads: threads})
		},
		Memory:        p.Memory(),
		Deterministic: false, // each threads value gets its own memory: the suite uploads to p's
		Short:         true,
	})
}

// TestHostCannotTouch: device memory is reachable only through the Memory; host
// accessors panic, host tensors are refused by the provider, and a freed tensor
// is dead.
func TestHostCannotTouch(t *testing.T) {
	p, _ := sim.New(sim.Options{})
	m := p.Memory()
	d, err := m.Alloc(tensor.Float32, 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	if d.Device().String() != "sim:0" || d.OnHost() {
		t.Fatalf("allocated %v", d)
	}
	for name, f := range map[string]func(){
		"Float32":   func() { _ = d.Float32() },
		"At":        func() { _ = d.At(0) },
		"HostBytes": func() { _ = tensor.HostBytes(d) },
	} {
		func() {
			defer func() {
				r := recover()
				err, _ := r.(error)
				if !errors.Is(err, tensor.ErrDevice) || !strings.Contains(err.Error(), "sim:0") {
					t.Errorf("%s on a sim tensor: recovered %v, want a panic naming the device", name, r)
				}
			}()
			f()
		}()
	}
	h := tensor.New(tensor.Float32, 2, 3)
	if err := p.GeluForward(d, h); !errors.Is(err, kernels.ErrDevice) {
		t.Errorf("host operand: %v", err)
	}
	if err := m.Free(d); err != nil {
		t.Fatal(err)
	}
	if err := p.GeluForward(d, d); !errors.Is(err, tensor.ErrDevice) {
		t.Errorf("use after free: %v", err)
	}
}

// TestTransfersCounted: every host-device copy is counted, by direction and
// purpose; copies within the device are not transfers.
func TestTransfersCounted(t *testing.T) {
	m := sim.NewMemory(1)
	h, _ := tensor.FromFloat32([]float32{1, 2, 3, 4}, 4)
	d, err := tensor.Upload(m, h)
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Clone()
	if err != nil {
		t.Fatal(err)
	}
	back, err := tensor.Download(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Float32(); got[0] != 1 || got[3] != 4 {
		t.Fatalf("round trip %v", got)
	}
	p := make([]byte, 8)
	if err := m.Read(p, d, 4, tensor.Staging); err != nil {
		t.Fatal(err)
	}
	if err := m.Read(p, d, 12, tensor.Staging); err == nil {
		t.Error("read past the end accepted")
	}
	want := tensor.Transfers{H2D: tensor.Count{Calls: 1, Bytes: 16}, D2H: tensor.Count{Calls: 1, Bytes: 16},
		StagedD2H: tensor.Count{Calls: 1, Bytes: 8}}
	if got := m.Transfers(); got != want {
		t.Errorf("transfers %+v, want %+v", got, want)
	}
}
