package collective

import (
	"fmt"
)

// noneTransport is the data plane of a control-only rank (Config.Transport
// "none"): it carries no bytes. Join with it runs everything else for real —
// the NATS connection, the rendezvous, heartbeats, failure notices, abort —
// so that bench/control can simulate thousands of ranks in one process and
// measure the control plane alone. Every Send and Recv fails with ErrInvalid.
type noneTransport struct{ rank, size int }

func (t noneTransport) Name() string  { return "none" }
func (t noneTransport) Rank() int     { return t.rank }
func (t noneTransport) Size() int     { return t.size }
func (t noneTransport) MaxChunk() int { return 1 << 20 }

func (t noneTransport) Send(Deadline, int, *Header, []byte) error {
	return fmt.Errorf("%w: transport \"none\" carries no data (control-plane simulation)", ErrInvalid)
}

func (t noneTransport) Recv(Deadline, int, *Header, []byte) error {
	return fmt.Errorf("%w: transport \"none\" carries no data (control-plane simulation)", ErrInvalid)
}

func (t noneTransport) Abort([]int, error) {}
func (t noneTransport) Close() error       { return nil }
