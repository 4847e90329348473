package collectivetest

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshrun/meshrun/collective"
)

// Fault says what a FaultTransport does once its rank has sent After messages.
type Fault struct {
	After int64
	// Close closes the transport (the rank "exits": its peers see it vanish).
	Close bool
	// Stall blocks every later Send until the World fails (a hung rank).
	Stall bool
	// Count adds to the count of every later header (a rank that disagrees on
	// the shape, seen mid-stream).
	Count uint64
}

// FaultTransport wraps a Transport and injects Fault.
type FaultTransport struct {
	collective.Transport
	F    Fault
	sent atomic.Int64
}

func (f *FaultTransport) Send(dl collective.Deadline, peer int, h *collective.Header, p []byte) error {
	if f.sent.Add(1) > f.F.After {
		switch {
		case f.F.Close:
			f.Transport.Close()
		case f.F.Stall:
			<-dl.Done
			return dl.Err(peer, "sending")
		case f.F.Count != 0:
			h.Count += f.F.Count
		}
	}
	return f.Transport.Send(dl, peer, h, p)
}

// Goroutines returns a function that fails t if, within 5 s, the number of
// goroutines has not come back to what it is now.
func Goroutines(t testing.TB) func() {
	before := runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Fatalf("goroutines leaked: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:n])
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
