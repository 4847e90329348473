#!/usr/bin/env bash
# Measures meshrun's control plane at N simulated ranks (bench/control): one
# JSON line per N. Each N runs in two processes under a time limit: the first
# job (rendezvous, steady state, a rank killed), then the abort job, whose
# fields are merged into the line; a size that cannot finish is recorded as
# such and the next one still runs.
#   bash bench/control/run.sh                  # N = 64, 256, 1024, 4096
#   RANKS="64 256" LIMIT=300 bash bench/control/run.sh -window 5s
#   RANKS="64 256 1024 4096" bash bench/control/run.sh -cluster 3
# Extra arguments go to the runner (see go run ./bench/control -h).
# -cluster 3 runs each job against 3 nats-server processes on loopback joined
# by routes (rank r on server r mod 3; each job its own servers, with the
# embedded server's users and permissions) instead of the embedded server;
# its line has "servers":3, msgs_per_s and bytes_per_s of the clients summed
# over the servers' /varz less their /routez, the routes' own traffic in
# route_msgs_per_s and route_bytes_per_s. It needs nats-server on PATH or in
# /usr/sbin (apt-get install nats-server) and fails before any work without it.
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=${RANKS:-64 256 1024 4096}
limit=${LIMIT:-400}
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
go build -o "$dir/ctlbench" ./bench/control
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(uname -r), $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
run() { # n, output file, runner arguments...
  local n=$1 out=$2 start
  shift 2
  start=$(date +%s)
  if ! timeout --signal=KILL "$limit" "$dir/ctlbench" -ranks "$n" "$@" >"$out"; then
    echo "{\"ranks\":$n,\"error\":\"stopped after $(( $(date +%s) - start )) s (limit ${limit} s)\"}" >"$out"
  fi
}
for n in $ranks; do
  run "$n" "$dir/a.json" -skip-abort "$@"
  run "$n" "$dir/b.json" -abort-only "$@"
  python3 - "$dir/a.json" "$dir/b.json" <<'PY'
import json, sys
a, b = (json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[1:3])
for k in ("abort_s", "abort_job_rendezvous_s"):
    a[k] = b.get(k, 0)
if b.get("error"):
    a["error"] = (a.get("error", "") + "; abort job: " + b["error"]).lstrip("; ")
print(json.dumps(a))
PY
done
