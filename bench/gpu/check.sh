#!/usr/bin/env bash
# Every GPU check of docs/gpu.md in one go, on a GPU machine, after
# deploy/gpu.sh build; each step's output goes to DIR (default
# gpu-check/), a summary to DIR/summary.md and the console.
#
#   bench/gpu/check.sh [DIR]
#
#  1. the kernels conformance suite on the GPU (bin/cuda.test);
#  2. an NCCL world of one (bin/nccl.test);
#  3. the MLP on one GPU against the cpu run: losses within 1e-4 relative
#     (float32, TF32 off), and the step's copies (h2d 0, d2h 8 bytes);
#  4. the MLP on two ranks sharing the GPU (staged) against two cpu ranks;
#  5. verify --device cuda --quick;
#  6. bench/gpu/run.sh: linear and MLP step against PyTorch.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-gpu-check}
mkdir -p "$out"
sum="$out/summary.md"
: >"$sum"
say() { echo "$*" | tee -a "$sum"; }
step() { # step NAME CMD...: runs CMD, its output to DIR/NAME.log
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  say "- $name: rc $rc ($((SECONDS - t0)) s): $*"
  return $rc
}
if [ -z "${MESHRUN_NCCL_LIBRARY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q libnccl.so.2; then
  lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)
  [ -n "$lib" ] && [ -e "$lib" ] && export MESHRUN_NCCL_LIBRARY=$lib
fi
say "# GPU checks $(date -u +%FT%TZ)"
say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n1)"
say "NCCL: ${MESHRUN_NCCL_LIBRARY:-libnccl.so.2 from the loader path}"
step conformance bin/cuda.test -test.v -test.run 'TestConformance'
step nccl-world-of-1 bin/nccl.test -test.v
# losses: the "step i/n loss L" lines of a run, one per line.
losses() { sed -n 's/.*| step \([0-9]*\)\/[0-9]* loss \([^ ]*\).*/\1 \2/p' "$1"; }
compare() { # compare A B: the largest relative difference of two runs' losses
  join <(losses "$1") <(losses "$2") | awk '{d = $2 - $3; if (d < 0) d = -d; r = d / ($3 < 0 ? -$3 : $3); if (r > m) m = r} END {printf "%.3g\n", m}'
}
copies() { tail -n1 "$1" | python3 -c 'import json,sys; r = json.loads(sys.stdin.read().split("| ", 1)[1]); print("h2d", r["h2d_bytes_per_step"], "d2h", r["d2h_bytes_per_step"], "staged", r["staged_bytes_per_step"], "step_ms", r["step_ms_median"])' 2>&1; }
step mlp-cpu-1 bin/launcher run -n 1 --device cpu mlp
step mlp-cuda-1 bin/launcher run -n 1 --device cuda mlp
say "  one GPU: largest relative loss difference to the cpu run $(compare "$out/mlp-cuda-1.log" "$out/mlp-cpu-1.log"); per step $(copies "$out/mlp-cuda-1.log")"
step mlp-cpu-2 bin/launcher run -n 2 --device cpu mlp
step mlp-cuda-2 bin/launcher run -n 2 --device cuda --share-gpus mlp
say "  two ranks on one GPU: largest relative loss difference $(compare "$out/mlp-cuda-2.log" "$out/mlp-cpu-2.log"); per step $(copies "$out/mlp-cuda-2.log")"
step verify bin/worker verify --device cuda --quick
step bench bench/gpu/run.sh bin/cuda.test
cat "$out/bench.log" >>"$sum"
echo "summary: $sum"
