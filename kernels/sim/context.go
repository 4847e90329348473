package sim

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/meshrun/meshrun/tensor"
)

// Contexts, streams and identity: what a device collective library needs of
// a GPU's memory, modelled on the cuda provider's. A CUDA context is current
// on an OS thread; NCCL's calls on a communicator must be made with the
// context current that was current when it was created. The cuda Memory's Run
// makes the device's primary context current on a locked thread for the
// duration of a function, serialized with the provider's work; its Stream is
// the provider's stream; its DeviceID names the physical GPU.
//
// Here Run does the same for the simulated device, and Current says which
// context is current on the calling thread, so that the fake NCCL of package
// collective refuses a call made without its communicator's context, as NCCL
// does. In-process ranks with one ordinal model in-process GPU ranks, which
// share one GPU: one DeviceID, one primary context. Separate processes are
// separate devices (the identity names the host and process).

var (
	hostname = func() string {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return "localhost"
		}
		return h
	}()
	separate atomic.Int32   // > 0: every new Memory is a device of its own
	serial   atomic.Uint64  // numbers those devices
	streams  atomic.Uintptr // the last stream handle given out
)

// current maps an OS thread (its id) to the context current on it.
var current struct {
	sync.Mutex
	on map[int]string
}

// deviceID is the identity of device sim:ordinal made now in this process.
func deviceID(ordinal int) string {
	if separate.Load() > 0 {
		return fmt.Sprintf("sim:%d#%d@%s/%d", ordinal, serial.Add(1), hostname, os.Getpid())
	}
	return fmt.Sprintf("sim:%d@%s/%d", ordinal, hostname, os.Getpid())
}

// SeparateDevices makes every Memory made until restore is called a device of
// its own (its own DeviceID and primary context), whatever its ordinal: the
// in-process ranks of a test then model ranks on GPUs of their own, as
// separate processes are, and can take the nccl backend (which refuses two
// ranks of a group on one device).
func SeparateDevices() (restore func()) {
	separate.Add(1)
	var once sync.Once
	return func() { once.Do(func() { separate.Add(-1) }) }
}

// DeviceID is the simulated device's identity, as the cuda Memory's names
// the physical GPU: "sim:ORDINAL@HOST/PID" (with "#N" after the ordinal for
// the devices of SeparateDevices). Memories of one ordinal in one process
// are one device.
func (m *Memory) DeviceID() string { return m.id }

// Stream is the handle of the memory's stream, as the cuda Memory's is the
// provider's CUstream: non-zero (never the legacy default stream), distinct
// per Memory.
func (m *Memory) Stream() uintptr { return m.stream }

// Context names the device's primary context: the one Run makes current.
func (m *Memory) Context() string { return "primary context of " + m.id }

// Run runs f with the device's primary context current on the calling OS
// thread, which stays locked to the goroutine for f's duration; Runs of one
// Memory are serialized, as the cuda Memory's are with its provider's work.
// A Run of the same Memory inside f is an error (the cuda provider's would
// deadlock); one of another device makes that device's context current until
// it returns.
func (m *Memory) Run(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	if m.owner.Load() == int64(tid) {
		return fmt.Errorf("%w: Run of %v inside its own Run on one thread (the cuda provider's would deadlock)", tensor.ErrDevice, m.dev)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.owner.Store(int64(tid))
	defer m.owner.Store(0)
	prev := makeCurrent(tid, m.Context())
	defer makeCurrent(tid, prev)
	return f()
}

// makeCurrent makes ctx current on thread tid ("" for none) and returns the
// context that was.
func makeCurrent(tid int, ctx string) string {
	current.Lock()
	defer current.Unlock()
	prev := current.on[tid]
	if ctx == "" {
		delete(current.on, tid)
	} else {
		if current.on == nil {
			current.on = map[int]string{}
		}
		current.on[tid] = ctx
	}
	return prev
}

// Current returns the context current on the calling OS thread ("" when
// none is): a sim Memory's Context while in its Run. A device library calls
// it from inside Run, on the thread Run locked.
func Current() string {
	tid := unix.Gettid()
	current.Lock()
	defer current.Unlock()
	return current.on[tid]
}

// linkMemory is the memory with a stream of its own (WithStream).
type linkMemory struct {
	*Memory
	stream uintptr
}

// WithStream returns the memory with a stream of its own, as the cuda
// Memory's WithStream makes one: a device library's communicator made on it
// (a pipeline's link) queues its work there, apart from the kernels'.
func (m *Memory) WithStream() (tensor.Memory, error) {
	return &linkMemory{Memory: m, stream: streams.Add(1)}, nil
}

// Stream is the link's own stream.
func (l *linkMemory) Stream() uintptr { return l.stream }

// After orders the link's stream after the work queued on the memory's:
// nothing to do on the simulated device, whose work is done when queued.
func (l *linkMemory) After() error { return nil }
