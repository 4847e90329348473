package collective_test

import (
	"testing"

	"github.com/meshrun/meshrun/collective/collectivetest"
)

// TestConformanceNCCL runs the conformance suite through the nccl backend
// over the fake library: in-process ranks, and processes' worlds joined over
// NATS (the unique id and the bootstrap cross a real NATS server) on shared
// memory.
func TestConformanceNCCL(t *testing.T) {
	t.Run("local", func(t *testing.T) { collectivetest.RunOn(t, localWorlds, collectivetest.NCCL) })
	t.Run("shm", func(t *testing.T) { collectivetest.RunOn(t, joinedWorlds("shm"), collectivetest.NCCL) })
}
