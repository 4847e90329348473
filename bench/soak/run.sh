#!/bin/sh
# Soak: 200 consecutive launcher jobs of 2-4 ranks (barrier: NATS, rendezvous,
# shared memory), then 5 at once, checking that no process, /dev/shm file,
# descriptor or goroutine is left behind (launch TestSoak; the suite runs 20).
# Usage: bench/soak/run.sh [JOBS]
set -e
cd "$(dirname "$0")/../.."
MESHRUN_SOAK=${1:-200} go test ./launch -run '^TestSoak$' -count 1 -v -timeout 30m | grep -E 'soak_test|^(ok|FAIL|---)'
