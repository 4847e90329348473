package models_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/job"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/kernels/providers"
	"github.com/meshrun/meshrun/linear"
	"github.com/meshrun/meshrun/models"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/tensor"
)

// leaky is a device whose GELU also copies its input to the host: one more
// tensor moved per step than the block needs.
type leaky struct {
	kernels.Compute
}

func (l leaky) GeluForward(y, x *tensor.Tensor) error {
	if _, err := tensor.Download(x); err != nil {
		return err
	}
	return l.Compute.GeluForward(y, x)
}

// peeking is a device whose GELU reads its input through the host accessor, as
// a careless provider or layer would.
type peeking struct {
	kernels.Compute
}

func (p peeking) GeluForward(y, x *tensor.Tensor) error {
	_ = x.Float32()[0]
	return p.Compute.GeluForward(y, x)
}

// stepTransfers trains the block for two steps on a sim device per rank
// (wrapped by wrap) and returns rank 0's copies of the second step.
func stepTransfers(t *testing.T, mesh string, wrap func(kernels.Compute) kernels.Compute) (tensor.Transfers, error) {
	m, err := placement.ParseMesh(mesh)
	if err != nil {
		t.Fatal(err)
	}
	cfg := models.MLPConfig{Mesh: m, Tokens: 12, Hidden: 8, FFN: 24, Seed: 5, LR: 0.05}
	var mu sync.Mutex
	var got tensor.Transfers
	err = job.InProcess(context.Background(), m.Size(), func(ctx context.Context, w *collective.World) error {
		d, err := providers.New("sim", nil)
		if err != nil {
			return err
		}
		b, err := models.NewMLP(cfg, w.Rank(), d)
		if err != nil {
			return err
		}
		rt := linear.Runtime{World: w, Kernels: wrap(d)}
		for s := 0; s < 2; s++ {
			before := d.Transfers()
			if _, err := b.Step(ctx, rt); err != nil {
				return err
			}
			if w.Rank() == 0 && s == 1 {
				mu.Lock()
				got = d.Transfers().Sub(before)
				mu.Unlock()
			}
		}
		return nil
	})
	return got, err
}

// TestStepTransfersCounted: a step on the device copies the loss (8 bytes) to
// the host and nothing else; a step that moves one more tensor shows exactly
// its bytes more: the counts come from the copies, not from assumptions.
func TestStepTransfersCounted(t *testing.T) {
	same := func(d kernels.Compute) kernels.Compute { return d }
	base, err := stepTransfers(t, "tp=2", same)
	if err != nil {
		t.Fatal(err)
	}
	if base.H2D != (tensor.Count{}) || base.D2H != (tensor.Count{Calls: 1, Bytes: 8}) {
		t.Fatalf("a step copied h2d %+v d2h %+v, want nothing in and the loss out", base.H2D, base.D2H)
	}
	if base.StagedD2H.Bytes == 0 || base.StagedH2D.Bytes == 0 {
		t.Fatalf("tp=2 collectives staged nothing: %+v", base)
	}
	extra, err := stepTransfers(t, "tp=2", func(d kernels.Compute) kernels.Compute { return leaky{d} })
	if err != nil {
		t.Fatal(err)
	}
	// The GELU input is rank 0's shard of h: 12 tokens x 24/2 ffn float32s.
	want := tensor.Count{Calls: 2, Bytes: 8 + 12*12*4}
	if extra.D2H != want || extra.H2D != base.H2D {
		t.Fatalf("with the GELU input copied out too: d2h %+v, want %+v", extra.D2H, want)
	}
}

func spec(t testing.TB, s string, m placement.Mesh) placement.Spec {
	sp, err := placement.ParseSpec(s, m)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

// oneRank is a world of one rank in this goroutine (panics stay here).
func oneRank(t *testing.T) *collective.World {
	w, err := collective.NewWorld(collective.LocalTransports(1)[0], collective.LocalControls(1)[0], collective.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// TestHostTouchFailsLoudly: host code reading a layer's device memory panics
// with an error naming the device, where it happens; on the host the same code
// runs.
func TestHostTouchFailsLoudly(t *testing.T) {
	m := placement.MustMesh([]int{1}, nil)
	cfg := models.MLPConfig{Mesh: m, Tokens: 12, Hidden: 8, FFN: 24, Seed: 5, LR: 0.05}
	step := func(provider string) (recovered any, err error) {
		defer func() { recovered = recover() }()
		d, err := providers.New(provider, nil)
		if err != nil {
			return nil, err
		}
		b, err := models.NewMLP(cfg, 0, d)
		if err != nil {
			return nil, err
		}
		_, err = b.Step(context.Background(), linear.Runtime{World: oneRank(t), Kernels: peeking{d}})
		return nil, err
	}
	got, err := step("sim")
	perr, _ := got.(error)
	if err != nil || !errors.Is(perr, tensor.ErrDevice) || !strings.Contains(fmt.Sprint(perr), "sim:0") || !strings.Contains(fmt.Sprint(perr), "host access") {
		t.Fatalf("host read of device memory: recovered %v (error %v), want a panic naming the device", got, err)
	}
	// The same code on the host: nothing to refuse.
	if got, err := step("cpu"); got != nil || err != nil {
		t.Fatalf("on the host: recovered %v, error %v", got, err)
	}
	// A host tensor handed to a layer on the device is refused, not moved.
	d, _ := providers.New("sim", nil)
	l, err := linear.New(linear.Config{Name: "fc", X: spec(t, "4x6:[R]", m), W: spec(t, "8x6:[R]", m), Grads: linear.AllGrads}, 0, d)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = l.Forward(context.Background(), linear.Runtime{World: oneRank(t), Kernels: d}, tensor.New(tensor.Float32, 4, 6))
	if !errors.Is(err, kernels.ErrDevice) {
		t.Fatalf("host input to a sim layer: %v", err)
	}
}
