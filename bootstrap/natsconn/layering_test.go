package natsconn

import (
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// A client never links a server package: natsconn (and natsconn/creds, which
// workers read their credentials with) must not depend on natsrv or on
// nats-server.
func TestLayering(t *testing.T) {
	deps.Forbid(t, []string{deps.Module + "/bootstrap/natsconn/..."}, deps.Module+"/natsrv", "github.com/nats-io/nats-server")
}
