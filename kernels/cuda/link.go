//go:build cuda

package cuda

import (
	"fmt"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/meshrun/meshrun/tensor"
)

// linkMemory is the provider's memory with a stream of its own
// (WithStream): a device library's communicator made on it queues its work
// there, so that a pipeline's sends and receives, which wait for the
// neighbouring stage, never hold the kernels back (nor the kernels them).
// Its Run is the provider's (the same context, serialized with its work).
type linkMemory struct {
	*Memory
	s  cu.Stream
	ev cu.Event
}

// WithStream returns the memory with a stream of its own (non-blocking) and
// an event to order it after the provider's stream (After). They live as
// long as the process: one per link a pipeline stage makes.
func (m *Memory) WithStream() (tensor.Memory, error) {
	l := &linkMemory{Memory: m}
	err := m.p.on(func() error {
		var err error
		if l.s, err = cu.MakeStream(cu.NonBlocking); err != nil {
			return fmt.Errorf("cuda: a link's stream: %w", err)
		}
		if l.ev, err = cu.MakeEvent(cu.DisableTiming); err != nil {
			l.s.Destroy()
			return fmt.Errorf("cuda: a link's event: %w", err)
		}
		return nil
	}, false)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Stream is the link's own stream.
func (l *linkMemory) Stream() uintptr { return *(*uintptr)(unsafe.Pointer(&l.s)) }

// After makes the link's stream wait for the work queued so far on the
// provider's stream (an event recorded there, waited for here): a send
// queued next reads what the kernels wrote. It runs inside Run (the
// context current).
func (l *linkMemory) After() error {
	if err := l.ev.Record(l.p.stream); err != nil {
		return fmt.Errorf("cuda: cuEventRecord: %w", err)
	}
	if err := l.s.Wait(l.ev, 0); err != nil {
		return fmt.Errorf("cuda: cuStreamWaitEvent: %w", err)
	}
	return nil
}
