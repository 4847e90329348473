package linear

import (
	"context"
	"fmt"
	"slices"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/kernels"
	"github.com/meshrun/meshrun/placement"
	"github.com/meshrun/meshrun/redistribute"
	"github.com/meshrun/meshrun/spmd"
	"github.com/meshrun/meshrun/tensor"
)

// Runtime is what a rank computes and communicates with.
type Runtime struct {
	World *collective.World
	// Kernels is the rank's device: its kernels, and the memory every tensor
	// of a step is allocated in.
	Kernels kernels.Compute
	// Record, if set, receives every step the layer executes, with the tensor it
	// moved ("x", "y", "dw"...).
	Record func(tensor string, ex redistribute.Executed)
	// Trace, if set, is called when a redistribution starts (name is the tensor,
	// cat "collective") and when one of the layer's ops starts (name
	// "linear_forward", "linear_backward_input"...; cat "op"); the function it
	// returns is called when it ends.
	Trace func(name, cat string) (end func())
}

// Op runs one op (a lowered kernel call) of a layer, or of a model built on
// layers, in a trace span of category "op" when the runtime traces, so that
// a model's own ops (a layer norm, attention) show in the trace beside its
// layers'.
func (rt Runtime) Op(name string, f func() error) error {
	if rt.Trace == nil {
		return f()
	}
	defer rt.Trace(name, "op")()
	return f()
}

// Scratch keeps the tensors a layer writes from one step to the next, so that a
// step neither allocates nor zeroes them again. A model built on layers keeps
// its own activations and buffers in one too.
type Scratch map[string]*tensor.Tensor

// Get returns the tensor of dtype dt kept under name, allocated in m if new or
// if its shape or dtype changed.
func (s Scratch) Get(m tensor.Memory, name string, dt tensor.DType, shape []int) (*tensor.Tensor, error) {
	if t, ok := s[name]; ok && t.DType() == dt && slices.Equal(t.Shape(), shape) {
		return t, nil
	}
	if old, ok := s[name]; ok {
		if err := m.Free(old); err != nil {
			return nil, err
		}
	}
	t, err := m.Alloc(dt, shape...)
	if err != nil {
		return nil, err
	}
	s[name] = t
	return t, nil
}

// Bytes is the memory of the tensors s keeps.
func (s Scratch) Bytes() int64 {
	var n int64
	for _, t := range s {
		n += int64(t.Bytes())
	}
	return n
}

// CopyOf returns a copy of t in scratch name (on t's device).
func (s Scratch) CopyOf(name string, t *tensor.Tensor) (*tensor.Tensor, error) {
	m := tensor.MemoryOf(t)
	c, err := s.Get(m, name, t.DType(), t.Shape())
	if err != nil {
		return nil, err
	}
	if n := t.Bytes(); n > 0 {
		err = m.Copy2D(c, 0, n, t, 0, n, n, 1)
	}
	return c, err
}

// Execute runs one move's steps on tensor name (t, rank's shard), on its
// device, as the layer named owner: the move is traced and recorded as the
// runtime asks, and an error names the owner. A layer runs its plans' moves
// with it; a model built on layers runs its own (an embedding's partial
// sums, a loss's statistics) the same way. The tensors the move writes come
// from bufs (nil: fresh ones), keyed by the phase, the tensor and the layout
// it moves to, so a step reuses the last step's.
func Execute(ctx context.Context, rt Runtime, owner, name string, m spmd.Move, t *tensor.Tensor, rank int, bufs Scratch, phase string) (*tensor.Tensor, error) {
	end := func() {}
	if rt.Trace != nil {
		end = rt.Trace(name, "collective")
	}
	alloc := redistribute.NewAlloc
	if bufs != nil {
		prefix := phase + "/" + name + "/" + placement.FormatList(m.To.Placements) + "/"
		alloc = func(mem tensor.Memory, key string, dt tensor.DType, n int) (*tensor.Tensor, error) {
			return bufs.Get(mem, prefix+key, dt, []int{n})
		}
	}
	out, log, err := redistribute.Execute(ctx, rt.World, m.Steps, t, alloc)
	end()
	if err != nil {
		return nil, fmt.Errorf("linear %s: moving %s %s -> %s: %w", owner, name, m.From, m.To, err)
	}
	if rt.Record != nil {
		for _, ex := range log {
			rt.Record(name, ex)
		}
	}
	return out.Reshape(m.To.LocalShape(rank)...)
}
