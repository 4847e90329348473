package collective_test

import (
	"testing"

	"github.com/meshrun/meshrun/internal/deps"
)

// Package collective is the World, the algorithms and the backends over the
// Transport and Control interfaces: it builds no real data plane (package
// transport), does not join a job (package bootstrap) and does not speak
// NATS; its own tests may use all three, through bootstraptest. It moves
// buffers between ranks and knows nothing of placements: package
// redistribute, above it, executes placement plans with it, so importing
// placement, spmd (which plans with placement) or redistribute would turn the
// layering around.
func TestLayering(t *testing.T) {
	deps.Forbid(t, []string{deps.Module + "/collective"},
		deps.Module+"/transport", deps.Module+"/bootstrap", "github.com/nats-io/nats.go",
		deps.Module+"/placement", deps.Module+"/spmd", deps.Module+"/redistribute")
}

// Package transport implements collective's interfaces for real jobs; the
// nats data path takes a connection interface, so that bootstrap alone owns
// the NATS client.
func TestLayeringTransport(t *testing.T) {
	deps.Forbid(t, []string{deps.Module + "/transport"}, deps.Module+"/bootstrap", "github.com/nats-io/nats.go")
}
