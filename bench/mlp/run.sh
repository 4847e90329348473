#!/usr/bin/env bash
# Compares meshrun's Megatron MLP training step (`launcher run -n TP mlp`) with the
# same step in PyTorch on the gloo backend (bench/mlp/torch_mlp.py, Debian's
# python3-torch), on the same CPU ranks, in one run, and prints a Markdown table.
#
#   bench/mlp/run.sh [repetitions] [steps]        (defaults: 5 repetitions, 20 steps)
#
# MLP_BENCH_DTYPES="float32 bfloat16" runs every cell in each dtype (default
# float32): meshrun's `mlp --dtype` and PyTorch's step under autocast, and adds a
# table of bf16 against float32 (step time, comm bytes, final loss).
#
# MLP_BENCH_BASE=REV also builds commit REV and runs it in every cell, alternating
# with the work tree (or MLP_BENCH_REV), so that a change's effect on the CPU step
# shows in one run: the table gains "base step ms" and "meshrun / base".
#
# Configs: tokens 512 hidden 1024 ffn 4096 (the issue's), and tokens 128 hidden
# 512 ffn 2048 (small: latency-bound). Each at tp = 1 and tp = 2, with the
# machine's cores split evenly over the ranks (meshrun: GOMAXPROCS; PyTorch:
# torch.set_num_threads). PyTorch runs twice per cell: in the environment as it
# is, and with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset for that one command
# (on this machine they may pin OpenBLAS to older kernels). The runs alternate
# (meshrun, PyTorch, PyTorch unset, next cell, ..., repeat), so background load
# hits every column alike; each cell is the best of the repetitions' medians.
# Raw JSON lines go to $MLP_BENCH_OUT (default: a temporary file, path printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-5}
steps=${2:-20}
py=/usr/bin/python3
configs=("512 1024 4096" "128 512 2048")

if ! $py -c 'import torch' 2>/dev/null; then
  echo "installing python3-torch" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >&2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Build the work tree, or the commit MLP_BENCH_REV names (a clean export of it);
# if the work tree does not build (work in progress), the last commit.
build_rev() {
  mkdir -p "$tmp/src"
  git archive "$1" | tar -x -C "$tmp/src"
  (cd "$tmp/src" && go build -o "$tmp/bin/" ./cmd/launcher ./cmd/worker)
  rev=$(git rev-parse --short "$1")
}
if [ -n "${MLP_BENCH_REV:-}" ]; then
  build_rev "$MLP_BENCH_REV"
elif go build -o "$tmp/bin/" ./cmd/launcher ./cmd/worker 2>"$tmp/build.log"; then
  rev=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench' ':!docs' 2>/dev/null || echo "+work-tree")
else
  echo "the work tree does not build; building the last commit instead:" >&2
  sed 's/^/  /' "$tmp/build.log" >&2
  build_rev HEAD
fi

base=""
if [ -n "${MLP_BENCH_BASE:-}" ]; then
  mkdir -p "$tmp/base-src"
  git archive "$MLP_BENCH_BASE" | tar -x -C "$tmp/base-src"
  (cd "$tmp/base-src" && go build -o "$tmp/base-bin/" ./cmd/launcher ./cmd/worker)
  base=$(git rev-parse --short "$MLP_BENCH_BASE")
fi

out=${MLP_BENCH_OUT:-$tmp/results.jsonl}
: >"$out"
cores=$($py -c 'import os; print(len(os.sched_getaffinity(0)))')
echo "meshrun $rev, $cores cores, torch $($py -c 'import torch; print(torch.__version__)'), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-unset}" >&2

# Other work on the machine distorts every column: before each measurement wait
# (up to MLP_BENCH_QUIET seconds, default 60) until the CPUs are at least 80%
# idle over half a second; count the measurements that started without that.
loaded=0 total=0
wait_quiet() {
  local deadline=$((SECONDS + ${MLP_BENCH_QUIET:-60})) u n s i w q x y u2 n2 s2 i2 w2 q2 x2 y2 busy idle
  total=$((total + 1))
  while :; do
    read -r _ u n s i w q x y _ </proc/stat
    sleep 0.5
    read -r _ u2 n2 s2 i2 w2 q2 x2 y2 _ </proc/stat
    busy=$(((u2 + n2 + s2 + q2 + x2 + y2) - (u + n + s + q + x + y)))
    idle=$(((i2 + w2) - (i + w)))
    ((busy * 5 <= busy + idle)) && return 0
    if ((SECONDS >= deadline)); then loaded=$((loaded + 1)); return 0; fi
  done
}

# tag JSON: prints one line {"impl": tag, "rep": r, ...report}
record() {
  local impl=$1 json=$2
  case $json in
    \{*\"step_ms_median\"*) ;;
    *) echo "$impl printed no report (tokens $t hidden $h ffn $f tp=$tp)" >&2; exit 1 ;;
  esac
  $py -c 'import json,sys; d=json.loads(sys.argv[3]); d["impl"]=sys.argv[1]; d["rep"]=int(sys.argv[2]); print(json.dumps(d))' \
    "$impl" "$r" "$json" >>"$out"
}

for r in $(seq "$reps"); do
  for cfg in "${configs[@]}"; do
    read -r t h f <<<"$cfg"
    for tp in 1 2; do
      for dt in ${MLP_BENCH_DTYPES:-float32}; do
      echo "repetition $r/$reps: tokens $t hidden $h ffn $f, tp=$tp, $dt" >&2
      # meshrun: rank 0 ends with one JSON line (the launcher may stamp a prefix).
      wait_quiet
      line=$("$tmp/bin/launcher" run -n "$tp" --log-dir "$tmp/runs" mlp --dtype "$dt" \
        --tokens "$t" --hidden "$h" --ffn "$f" --steps "$steps" 2>&1 | grep '"step_ms_median"' | tail -n1 || true)
      [ -z "$line" ] || line="{${line#*\{}"
      record meshrun "$line"
      if [ -n "$base" ] && [ "$dt" = float32 ]; then
        wait_quiet
        line=$("$tmp/base-bin/launcher" run -n "$tp" --log-dir "$tmp/runs" mlp \
          --tokens "$t" --hidden "$h" --ffn "$f" --steps "$steps" 2>&1 | grep '"step_ms_median"' | tail -n1 || true)
        [ -z "$line" ] || line="{${line#*\{}"
        record meshrun-base "$line"
      fi
      wait_quiet
      line=$($py bench/mlp/torch_mlp.py --tp "$tp" --tokens "$t" --hidden "$h" --ffn "$f" --steps "$steps" --dtype "$dt")
      record pytorch "$line"
      wait_quiet
      line=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
        $py bench/mlp/torch_mlp.py --tp "$tp" --tokens "$t" --hidden "$h" --ffn "$f" --steps "$steps" --dtype "$dt")
      record pytorch-unset "$line"
      done
    done
  done
done
[ -n "${MLP_BENCH_OUT:-}" ] || echo "raw results: kept only for this run" >&2

$py - "$out" "$reps" "$steps" "$rev" "$cores" "$loaded" "$total" "$base" <<'PY'
import collections, json, sys

path, reps, steps, rev, ncores, loaded, total, base = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7], sys.argv[8]
runs = collections.defaultdict(list)
cores = {}
for line in open(path):
    d = json.loads(line)
    tp = int(d["mesh"].split("=")[1])
    key = (d["tokens"], d["hidden"], d["ffn"], tp)
    runs[(d["impl"], d.get("dtype", "float32")) + key].append(d)
    if d["impl"].startswith("pytorch"):
        cores[d["impl"]] = d.get("blas_core", "?")

def best(impl, key, dtype="float32"):
    return min(runs[(impl, dtype) + key], key=lambda d: d["step_ms_median"])

keys = sorted({k[2:] for k in runs}, key=lambda k: (-k[0] * k[1] * k[2], k[3]))
bf16 = any(k[1] == "bfloat16" for k in runs)
print(f"meshrun {rev}, {ncores} cores split over the tp ranks; {reps} repetitions of {steps} steps, "
      "each cell the best repetition's median step.")
print()
print(f"{loaded} of {total} measurements started while other processes kept the CPUs more than 20% busy.")
print()
print(f"PyTorch BLAS kernels: `{cores.get('pytorch', '?')}` as the machine is set up, "
      f"`{cores.get('pytorch-unset', '?')}` with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset.")
print()
if base:
    print(f"Base: meshrun {base}, run in every cell beside {rev}.")
    print()
extra_head, extra_sep = (f" base ({base}) step ms | meshrun / base |", "---|---|") if base else ("", "")
print("| config (tokens x hidden x ffn) | tp | meshrun step ms |" + extra_head + " PyTorch step ms | PyTorch step ms (OPENBLAS_* unset) "
      "| meshrun / best PyTorch | meshrun GFLOP/s | kernel ms | comm ms | overhead ms | overhead / (kernel + comm) |")
print("|---|---|---|" + extra_sep + "---|---|---|---|---|---|---|---|")
worst_ratio, worst_over = 0.0, -1e9
for key in keys:
    t, h, f, tp = key
    m, p, u = best("meshrun", key), best("pytorch", key), best("pytorch-unset", key)
    pt = min(p["step_ms_median"], u["step_ms_median"])
    ratio = m["step_ms_median"] / pt
    over = m["overhead_ms"] / (m["kernel_ms"] + m["comm_ms"])
    worst_ratio, worst_over = max(worst_ratio, ratio), max(worst_over, over)
    extra = ""
    if base:
        b = best("meshrun-base", key)
        extra = f" {b['step_ms_median']:.2f} | {m['step_ms_median'] / b['step_ms_median']:.2f} |"
    print(f"| {t} x {h} x {f} | {tp} | {m['step_ms_median']:.2f} |{extra} {p['step_ms_median']:.2f} | {u['step_ms_median']:.2f} "
          f"| {ratio:.2f} | {m['gflops']:.1f} | {m['kernel_ms']:.2f} | {m['comm_ms']:.2f} | {m['overhead_ms']:.2f} | {100 * over:.1f}% |")
print()
print(f"Highest meshrun / PyTorch step-time ratio: {worst_ratio:.2f} (target: <= 1.00). "
      f"Highest overhead over kernel + comm: {100 * worst_over:.1f}% (target: < 10%).")
if bf16:
    print()
    print("bfloat16 (mixed precision: float32 masters and SGD, bf16 compute and wire) against float32, same run:")
    print()
    print("| config | tp | meshrun f32 ms | meshrun bf16 ms | bf16 / f32 | comm B/step f32 | bf16 | bytes ratio "
          "| loss after the steps f32 | bf16 | relative difference | PyTorch bf16 ms (best) | meshrun bf16 / PyTorch bf16 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in keys:
        t, h, f, tp = key
        a, b = best("meshrun", key), best("meshrun", key, "bfloat16")
        p = min(best("pytorch", key, "bfloat16")["step_ms_median"], best("pytorch-unset", key, "bfloat16")["step_ms_median"])
        cb = b["comm_bytes_per_step"] / a["comm_bytes_per_step"] if a["comm_bytes_per_step"] else float("nan")
        rel = abs(b["loss_last"] - a["loss_last"]) / abs(a["loss_last"])
        print(f"| {t} x {h} x {f} | {tp} | {a['step_ms_median']:.2f} | {b['step_ms_median']:.2f} | {b['step_ms_median'] / a['step_ms_median']:.2f} "
              f"| {a['comm_bytes_per_step']} | {b['comm_bytes_per_step']} | {cb:.3f} | {a['loss_last']:.6f} | {b['loss_last']:.6f} | {rel:.2e} "
              f"| {p:.2f} | {b['step_ms_median'] / p:.2f} |")
PY
