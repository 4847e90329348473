#!/usr/bin/env bash
# Benchmarks meshrun's collectives next to Gloo and Open MPI, measured in the same
# run on this machine, and prints the markdown table of docs/collective.md.
# Installs the peers from Debian if missing. Extra arguments go to the runner
# (e.g. -ranks 2 -max 1M -impls shm,gloo,mpi).
set -euo pipefail
cd "$(dirname "$0")/../.."
need=()
/usr/bin/python3 -c 'import torch' 2>/dev/null || need+=(python3-torch)
command -v mpirun >/dev/null || need+=(openmpi-bin)
command -v mpicc >/dev/null || need+=(libopenmpi-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >&2
fi
bin="$(mktemp -d)/meshrun-bench"
trap 'rm -rf "$(dirname "$bin")"' EXIT
go build -o "$bin" ./bench/collective
echo "# $(date -u +%FT%TZ) $(nproc) cores, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$bin" "$@"
