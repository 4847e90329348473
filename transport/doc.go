// Package transport holds the data planes of a real job, each a
// collective.Transport: shm (rings in shared memory between the ranks of one
// host, and their arenas), tcp (one authenticated connection per pair of
// ranks) and nats (messages through the NATS server, where ranks cannot reach
// each other), and none (no data plane, for simulating the control plane).
// Package bootstrap chooses one and builds it at Join.
//
// Every wait of a Send or Recv watches its collective.Deadline: its Done
// channel, its own abort, and a collective.WaitTimer armed for its time.
package transport

import (
	"fmt"

	"github.com/meshrun/meshrun/collective"
)

// invalid is an ErrInvalid error.
func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{collective.ErrInvalid}, a...)...)
}
