//go:build cuda

package nccl_test

import (
	"context"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels/cuda"
	"github.com/meshrun/meshrun/tensor"
)

// TestWorldOfOne: on a machine with a GPU and NCCL, a World of one rank runs
// its collectives through NCCL (skipped without either).
func TestWorldOfOne(t *testing.T) {
	p, err := cuda.New(0)
	if err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	defer p.Close()
	w, err := collective.NewWorld(collective.LocalTransports(1)[0], collective.LocalControls(1)[0], collective.Options{Collectives: collective.BackendNCCL})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	mem := p.Memory()
	c, err := w.Communicator(context.Background(), []int{0}, mem.Device())
	if err != nil {
		t.Skipf("no NCCL: %v", err)
	}
	h, _ := tensor.FromFloat32([]float32{1, 2, 3, 4}, 4)
	in, err := tensor.Upload(mem, h)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := mem.Alloc(tensor.Float32, 4)
	ctx := context.Background()
	for _, f := range []func() error{
		func() error { return c.AllReduce(ctx, in, collective.Sum) },
		func() error { return c.AllGather(ctx, in, out, []int{4}) },
		func() error { return c.ReduceScatter(ctx, out, in, []int{4}, collective.Max) },
		func() error { return c.Broadcast(ctx, in, 0) },
		func() error { return c.AllToAll(ctx, in, []int{4}, out, []int{4}) },
	} {
		if err := f(); err != nil {
			t.Fatalf("%s: %v", c.Algorithm(), err)
		}
	}
	got, _ := tensor.Download(out)
	if g := got.Float32(); c.Backend() != "nccl" || g[0] != 1 || g[3] != 4 {
		t.Errorf("backend %s: %v", c.Backend(), g)
	}
}
