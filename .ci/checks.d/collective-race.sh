#!/usr/bin/env bash
# The collective layer under the race detector: the conformance suite over every
# transport (local, shm, tcp, nats), the fault tests and the embedded server.
# One package at a time (-p 1): collective, transport and bootstrap each hold
# fault tests with deadlines of a second or so.
set -euo pipefail
cd "$(dirname "$0")/../.."
.ci/gotest collective-race -race -count=1 -p 1 -timeout 240s ./collective/... ./transport/... ./bootstrap/... ./natsrv/...
# No shared-memory ring may outlive the tests.
if ls /dev/shm/meshrun-* >/dev/null 2>&1; then
  echo "collective: shared-memory rings left in /dev/shm:" >&2
  ls -l /dev/shm/meshrun-* >&2
  exit 1
fi
