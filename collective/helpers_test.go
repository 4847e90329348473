package collective_test

import (
	"testing"

	"github.com/meshrun/meshrun/bootstrap/bootstraptest"
	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
	"github.com/meshrun/meshrun/natsrv"
)

// Worlds of real jobs (bootstrap.Join over a named transport) come from
// bootstraptest.

func newJob() string { return bootstraptest.NewJob() }
func startServer(t testing.TB, jobs ...string) *natsrv.Server {
	return bootstraptest.StartServer(t, jobs...)
}
func joinedWorlds(transport string) collectivetest.Factory {
	return bootstraptest.JoinedWorlds(transport)
}

func joinWorlds(t testing.TB, s *natsrv.Server, job string, n int, transport string, o collective.Options) []*collective.World {
	return bootstraptest.JoinWorlds(t, s, job, n, transport, o)
}
