package transport

import (
	"fmt"

	"github.com/meshrun/meshrun/collective"
)

// noneTransport is the data plane of a control-only rank (Config.Transport
// "none"): it carries no bytes. Join with it runs everything else for real —
// the NATS connection, the rendezvous, heartbeats, failure notices, abort —
// so that bench/control can simulate thousands of ranks in one process and
// measure the control plane alone. Every Send and Recv fails with ErrInvalid.
type noneTransport struct{ rank, size int }

// None returns the data plane of a control-only rank: every Send and Recv
// fails with ErrInvalid.
func None(rank, size int) collective.Transport { return noneTransport{rank: rank, size: size} }

func (t noneTransport) Name() string  { return "none" }
func (t noneTransport) Rank() int     { return t.rank }
func (t noneTransport) Size() int     { return t.size }
func (t noneTransport) MaxChunk() int { return 1 << 20 }

func (t noneTransport) Send(collective.Deadline, int, *collective.Header, []byte) error {
	return fmt.Errorf("%w: transport \"none\" carries no data (control-plane simulation)", collective.ErrInvalid)
}

func (t noneTransport) Recv(collective.Deadline, int, *collective.Header, []byte) error {
	return fmt.Errorf("%w: transport \"none\" carries no data (control-plane simulation)", collective.ErrInvalid)
}

func (t noneTransport) Abort([]int, error) {}
func (t noneTransport) Close() error       { return nil }
