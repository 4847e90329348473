package transport_test

import (
	"os"
	"testing"

	"github.com/meshrun/meshrun/bootstrap"
	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/natsrv"
	"github.com/meshrun/meshrun/transport"
	"github.com/nats-io/nats.go"
)

// The join helpers of these tests are bootstraptest's.

func newJob() string { return bootstraptest.NewJob() }
func startServer(t testing.TB, jobs ...string) *natsrv.Server {
	return bootstraptest.StartServer(t, jobs...)
}
func adminConn(t testing.TB, s *natsrv.Server) *nats.Conn { return bootstraptest.AdminConn(t, s) }
func joinedWorlds(transport string) collectivetest.Factory {
	return bootstraptest.JoinedWorlds(transport)
}

func config(s *natsrv.Server, job string, rank, n int, transport string, o collective.Options) bootstrap.Config {
	return bootstraptest.Config(s, job, rank, n, transport, o)
}

func joinAll(cfgs []bootstrap.Config) ([]*collective.World, []error) {
	return bootstraptest.JoinAll(cfgs)
}

func joinWorlds(t testing.TB, s *natsrv.Server, job string, n int, transport string, o collective.Options) []*collective.World {
	return bootstraptest.JoinWorlds(t, s, job, n, transport, o)
}

func watchRendezvous(t *testing.T, s *natsrv.Server) *bootstraptest.RendezvousWatch {
	return bootstraptest.WatchRendezvous(t, s)
}

func allReduceOnce(ws []*collective.World) error { return bootstraptest.AllReduceOnce(ws) }

// leftRings lists the files under /dev/shm at the names the rings of the
// job of roster can have, other than those in planted.
func leftRings(roster *collective.Roster, planted map[string]bool) []string {
	var left []string
	for _, p := range transport.ShmRingPaths(roster) {
		if _, err := os.Lstat(p); err == nil && !planted[p] {
			left = append(left, p)
		}
	}
	return left
}
