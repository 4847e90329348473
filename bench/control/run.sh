#!/usr/bin/env bash
# Measures meshrun's control plane at N simulated ranks (bench/control): one
# JSON line per N. Each N runs in its own process under a time limit, so a
# size that cannot finish is recorded as such and the next one still runs.
#   bash bench/control/run.sh                  # N = 64, 256, 1024, 4096
#   RANKS="64 256" LIMIT=300 bash bench/control/run.sh -window 5s
# Extra arguments go to the runner (see go run ./bench/control -h).
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=${RANKS:-64 256 1024 4096}
limit=${LIMIT:-400}
bin="$(mktemp -d)/meshrun-ctlbench"
trap 'rm -rf "$(dirname "$bin")"' EXIT
go build -o "$bin" ./bench/control
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(uname -r), $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for n in $ranks; do
  start=$(date +%s)
  if ! timeout --signal=KILL "$limit" "$bin" -ranks "$n" "$@"; then
    echo "{\"ranks\":$n,\"error\":\"stopped after $(( $(date +%s) - start )) s (limit ${limit} s)\"}"
  fi
done
