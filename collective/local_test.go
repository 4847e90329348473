package collective_test

import (
	"testing"

	"github.com/meshrun/meshrun/collective"
	"github.com/meshrun/meshrun/collective/collectivetest"
)

func localWorlds(t testing.TB, n int, o collective.Options) []*collective.World {
	ts := collective.LocalTransports(n)
	cs := collective.LocalControls(n)
	ws := make([]*collective.World, n)
	for i := range ws {
		w, err := collective.NewWorld(ts[i], cs[i], o)
		if err != nil {
			t.Fatal(err)
		}
		ws[i] = w
	}
	return ws
}

func TestConformanceLocal(t *testing.T) { collectivetest.Run(t, localWorlds) }
