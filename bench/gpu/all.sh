#!/usr/bin/env bash
# A whole GPU run in one command, for a GPU machine lent for minutes: the
# checks (bench/gpu/check.sh without its bench step), then the benchmarks
# against PyTorch (bench/gpu/run.sh), while the pipeline's schedules run on
# the machine's other CPU cores (bench/pipeline/run.sh, a core per stage).
# Everything lands in $OUT (gpu-run/ without it): summary.md and
# gpu-logs.tgz (check.sh's), bench.md (run.sh's tables and profiles) and
# pipeline.md, each written as its step goes.
#
#   bench/gpu/all.sh [SECONDS]   (default 480: when all must end)
#
# The cores: the GPU steps run on the upper half of the machine's CPUs
# (taskset), the pipeline's stages on the lower half, so that neither
# waits for the other's cores. MESHRUN_ALL_PIPELINE="REPS PP M STEPS"
# (default "3 4 8 8"; "none" skips it) are bench/pipeline/run.sh's
# arguments.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
limit=${1:-480}
case $limit in '' | *[!0-9]*) echo "all.sh: SECONDS: whole seconds, not '$limit'" >&2; exit 2 ;; esac
out=${OUT:-gpu-run}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1
log() { printf '# %s %s\n' "$(date -u +%T)" "$*" | tee -a "$out/bench.md" >&2; }

cores=$(nproc)
half=$((cores / 2))
gpu_cpus="$half-$((cores - 1))" pipe_cpus="0-$((half - 1))"
[ "$cores" -ge 4 ] || gpu_cpus="0-$((cores - 1))" pipe_cpus=""
: >"$out/bench.md"
log "all.sh: $cores CPUs; GPU steps on $gpu_cpus, pipeline on ${pipe_cpus:-none}; $limit s"

# The binaries first: the pipeline needs them before check.sh's build step.
if [ ! -x bin/worker ] && [ -f gpu-prebuilt/bin.tar.xz ]; then
  deploy/gpu.sh install >"$out/install.log" 2>&1 || log "deploy/gpu.sh install failed: $(tail -n 3 "$out/install.log")"
fi
eval "$(deploy/gpu.sh libs 2>/dev/null)" || true

pipe=
read -ra pargs <<<"${MESHRUN_ALL_PIPELINE:-3 4 8 8}"
if [ -n "$pipe_cpus" ] && [ "${pargs[0]:-none}" != none ] && [ -x bin/launcher ]; then
  (PIPE_BENCH_BIN=bin timeout -k 5 $((limit - 20)) taskset -c "$pipe_cpus" bench/pipeline/run.sh "${pargs[@]}" \
    >"$out/pipeline.md" 2>&1; echo "# exit $?" >>"$out/pipeline.md") &
  pipe=$!
fi

# The checks: their own deadline, a third of the time at most.
MESHRUN_CHECK_SKIP="bench ${MESHRUN_CHECK_SKIP:-}" OUT=$out taskset -c "$gpu_cpus" \
  bench/gpu/check.sh --deadline $((limit / 3)) >"$out/check.log" 2>&1
log "check.sh: exit $?, $SECONDS s"

# The benchmarks: what is left, less a margin for the pipeline and the end.
left=$((limit - SECONDS - 15))
if [ "$left" -gt 30 ]; then
  timeout -k 5 "$left" taskset -c "$gpu_cpus" bench/gpu/run.sh bin/cuda.test "${MESHRUN_ALL_SECS:-0.5}" >>"$out/bench.md" 2>&1
  log "run.sh: exit $?, $SECONDS s"
else
  log "run.sh: skipped, $left s left"
fi
if [ -n "$pipe" ]; then
  wait "$pipe"
  log "pipeline: done, $SECONDS s"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader >>"$out/bench.md" 2>&1 || true
