//go:build cuda

package nccl_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/nccl"
	"github.com/meshrun/meshrun/kernels/cuda"
	"github.com/meshrun/meshrun/tensor"
)

// TestWorldOfOne: on a machine with a GPU and NCCL, a World of one rank runs
// every collective through NCCL, and each one's output is what a world of one
// implies (skipped without a GPU or the library). An op that writes a buffer
// of its own (all-gather, reduce-scatter, all-to-all) writes one that was
// zeroed before it and is not its input, so that a call that did nothing
// fails; the in-place ones (all-reduce, broadcast) must leave their input's
// values. Nothing is staged through host memory.
func TestWorldOfOne(t *testing.T) {
	p, err := cuda.New(0, cuda.OptionsFrom(os.Getenv))
	if err != nil {
		t.Skipf("no CUDA device: %v", err)
	}
	defer p.Close()
	w, err := collective.NewWorld(collective.LocalTransports(1)[0], collective.LocalControls(1)[0], collective.Options{Collectives: collective.BackendNCCL, Backends: []collective.DeviceBackend{nccl.Backend(os.Getenv(collective.EnvNCCLLibrary))}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	mem := p.Memory()
	ctx := context.Background()
	c, err := w.Communicator(ctx, []int{0}, mem)
	if errors.Is(err, collective.ErrNoLibrary) {
		t.Skipf("no NCCL: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if c.Backend() != collective.BackendNCCL {
		t.Fatalf("backend %s", c.Backend())
	}
	const n = 37
	want := make([]float64, n)
	for i := range want {
		want[i] = float64(i%11) - 4.5
	}
	h64, _ := tensor.FromFloat64(want, n)
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float64, tensor.BFloat16} {
		h, err := tensor.Convert(h64, dt)
		if err != nil {
			t.Fatal(err)
		}
		in, err := tensor.Upload(mem, h)
		if err != nil {
			t.Fatal(err)
		}
		out, err := mem.Alloc(dt, n)
		if err != nil {
			t.Fatal(err)
		}
		// check fails unless x holds want's values (all of them exact in
		// every dtype).
		check := func(op string, x *tensor.Tensor) {
			t.Helper()
			got, err := tensor.Download(x)
			if err != nil {
				t.Fatalf("%v %s: %v", dt, op, err)
			}
			for i, v := range want {
				if got.At(i) != v {
					t.Fatalf("%v %s (%s): element %d is %v, want %v", dt, op, c.Algorithm(), i, got.At(i), v)
				}
			}
		}
		for _, tc := range []struct {
			op   string
			out  *tensor.Tensor // nil: in place, in
			call func() error
		}{
			{"all_reduce", nil, func() error { return c.AllReduce(ctx, in, collective.Sum) }},
			{"broadcast", nil, func() error { return c.Broadcast(ctx, in, 0) }},
			{"all_gather", out, func() error { return c.AllGather(ctx, in, out, []int{n}) }},
			{"reduce_scatter", out, func() error { return c.ReduceScatter(ctx, in, out, []int{n}, collective.Max) }},
			{"all_to_all", out, func() error { return c.AllToAll(ctx, in, []int{n}, out, []int{n}) }},
		} {
			if tc.out != nil {
				if err := mem.Zero(tc.out, 0, tc.out.Bytes()); err != nil {
					t.Fatal(err)
				}
				z, err := tensor.Download(tc.out)
				if err != nil {
					t.Fatal(err)
				}
				for i := range n {
					if z.At(i) != 0 {
						t.Fatalf("%v %s: output not zeroed: element %d is %v", dt, tc.op, i, z.At(i))
					}
				}
			}
			if err := tc.call(); err != nil {
				t.Fatalf("%v %s: %v", dt, tc.op, err)
			}
			if a := c.Algorithm(); len(a) < 5 || a[:5] != "nccl/" {
				t.Errorf("%v %s: algorithm %q", dt, tc.op, a)
			}
			if tc.out != nil {
				check(tc.op, tc.out)
			}
			check(tc.op+" (input)", in)
		}
	}
	if tr := mem.Transfers(); tr.StagedD2H.Calls != 0 || tr.StagedH2D.Calls != 0 {
		t.Errorf("staged through host memory: %+v", tr)
	}
}
