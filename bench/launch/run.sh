#!/usr/bin/env bash
# Launch overhead, side by side: from the command to every rank past rendezvous
# and one barrier, 8 CPU ranks on this machine.
#   meshrun:  launcher run -n 8 barrier
#   Open MPI: mpirun -np 8 ./mpi_barrier   (MPI_Init + one MPI_Barrier)
# Needs Debian's openmpi-bin, libopenmpi-dev and hyperfine (installed when missing
# and running as root). Usage: bench/launch/run.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-20}
np=8

need=()
command -v mpicc >/dev/null || need+=(libopenmpi-dev)
command -v mpirun >/dev/null || need+=(openmpi-bin)
command -v hyperfine >/dev/null || need+=(hyperfine)
if ((${#need[@]})); then
	if [ "$(id -u)" = 0 ]; then
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
	else
		echo "install: ${need[*]}" >&2
		exit 1
	fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/" ./cmd/launcher ./cmd/worker
mpicc -O2 -o "$work/mpi_barrier" bench/launch/mpi_barrier.c

mpi=(mpirun -np "$np" --oversubscribe)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
# Loopback only: no network interface but lo for the TCP BTL and the runtime.
mpi+=(--mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)

echo "machine: $(nproc) cores, $(uname -sr), $(go version | cut -d' ' -f3), $(mpirun --version | head -1)"
hyperfine --warmup 3 --runs "$runs" -N --export-markdown "$work/result.md" --export-json "$work/result.json" \
	-n "meshrun: launcher run -n $np barrier" \
	"$work/launcher run -n $np --log-dir $work/runs --console none barrier" \
	-n "Open MPI: mpirun -np $np (MPI_Init + MPI_Barrier)" \
	"${mpi[*]} $work/mpi_barrier"
cat "$work/result.md"
# Medians: this machine is shared, and a mean is at the mercy of one slow run.
if command -v python3 >/dev/null; then
	python3 -c 'import json,sys
for r in json.load(open(sys.argv[1]))["results"]:
    print("median %-48s %7.1f ms   min %7.1f ms" % (r["command"], r["median"]*1000, r["min"]*1000))' "$work/result.json"
fi
