package bootstrap

import (
	"context"
	"errors"

	"github.com/meshrun/meshrun/transport"
	"github.com/nats-io/nats.go"
)

// natsData gives the rank's NATS connection to the nats data transport,
// which does not depend on the client library (transport.NATS).
type natsData struct{ nc *nats.Conn }

func (d natsData) MaxPayload() int64                         { return d.nc.MaxPayload() }
func (d natsData) Publish(subject string, data []byte) error { return d.nc.Publish(subject, data) }
func (d natsData) Flush() error                              { return d.nc.Flush() }

func (d natsData) Subscribe(subject string, f func(subject, reply string, data []byte)) (transport.Subscription, error) {
	return d.nc.Subscribe(subject, func(m *nats.Msg) { f(m.Subject, m.Reply, m.Data) })
}

// ChanSubscribe hands each message's data to ch without blocking, from the
// subscription's goroutine: a message that finds ch full is dropped, as the
// client drops one for a slow consumer (the transport's credits keep ch from
// filling).
func (d natsData) ChanSubscribe(subject string, ch chan []byte, pending, pendingBytes int) (transport.Subscription, error) {
	sub, err := d.nc.Subscribe(subject, func(m *nats.Msg) {
		select {
		case ch <- m.Data:
		default:
		}
	})
	if err != nil {
		return nil, err
	}
	if err := sub.SetPendingLimits(pending, pendingBytes); err != nil {
		sub.Unsubscribe()
		return nil, err
	}
	return sub, nil
}

func (d natsData) Request(ctx context.Context, subject string) error {
	_, err := d.nc.RequestWithContext(ctx, subject, nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return transport.ErrNoResponders
	}
	return err
}
