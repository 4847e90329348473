package collective

import (
	"context"

	"github.com/nats-io/nats.go"
)

func shmAvailable() bool { return false }

func NewShmTransport(ctx context.Context, job string, rank, size int, r *Roster) (Transport, error) {
	return nil, ErrInvalid
}

func NewNatsTransport(ctx context.Context, nc *nats.Conn, job string, rank, size int) (Transport, error) {
	return nil, ErrInvalid
}
