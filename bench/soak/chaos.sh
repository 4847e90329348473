#!/usr/bin/env bash
# Chaos soak: JOBS launcher jobs of 2-4 ranks (ranktest's barrier loop), each
# over a transport drawn at random (shm, tcp, nats), with one fault done to a
# random rank once it runs: SIGKILL, SIGTERM, SIGSTOP, SIGSEGV (from outside),
# a panic, exit 3, or a hang (alive, never entering the next barrier). For
# each job: the fault, the rank, the root cause the launcher named and
# whether it is right, the time from the fault to the launcher's exit, and
# what was left (the job's processes, /dev/shm files, the launcher's
# descriptors); then the totals. It fails on any wrong root cause or
# leftover. launch TestChaos (the suite runs each fault once).
# Usage: bench/soak/chaos.sh [JOBS] [SEED]      (default 100 jobs, seed: the time)
set -eo pipefail
cd "$(dirname "$0")/../.."
MESHRUN_CHAOS=${1:-100} MESHRUN_CHAOS_SEED=${2:-} go test ./launch -run '^TestChaos$' -count 1 -v -timeout 60m |
  grep -E 'chaos_test|^(ok|FAIL|---)' | sed 's/^ *chaos_test.go:[0-9]*: //'
