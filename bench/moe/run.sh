#!/usr/bin/env bash
# Compares meshrun's mixture-of-experts training step (`launcher run moe`, the
# layer of docs/moe.md) with the same layer in PyTorch written the way Hugging
# Face's Mixtral sparse MoE block is (bench/moe/torch_moe_hf.py, Debian's
# python3-torch), on the same CPU cores, in one run, and prints a Markdown table.
#
#   bench/moe/run.sh [repetitions] [steps]        (defaults: 5 repetitions, 20 steps)
#
# Configs (tokens hidden ffn experts top-k): "1024 1024 1024 8 2" and
# "256 512 512 8 2"; MOE_BENCH_CONFIGS="T H F E K;T H F E K" replaces them.
# Each config runs three ways:
#
#   meshrun ep=1: GOMAXPROCS=$cores launcher run -n 1 moe --mesh ep=1 ...
#   meshrun ep=2: GOMAXPROCS=$cores launcher run -n 2 moe --mesh ep=2 ...
#   PyTorch:      torch_moe_hf.py --threads $cores ...
#
# The launcher shares its GOMAXPROCS out among its ranks and sets each rank's
# (launch/run.go: cores / n, at least 1; a value the launcher inherited does not
# reach the ranks), as bench/mlp/run.sh relies on: ep=1 gets every core in one
# rank, ep=2 half of them in each. The script prints the launcher's rank table
# (--dry-run) for both so that the split shows.
#
# The runs alternate (meshrun ep=1, meshrun ep=2, PyTorch, next config, ...,
# repeat), so background load hits every column alike; each cell is the best
# (minimum) of the repetitions' median step times. Raw JSON lines go to
# $MOE_BENCH_OUT (default: a temporary file, its path printed).
#
# MOE_BENCH_TORCH_ARGS adds arguments to every torch_moe_hf.py run (for
# instance "--slices index").
#
# MOE_BENCH_TORCH_ONLY=1 runs the PyTorch column alone (no Go build). A meshrun
# without the moe workload stops the script with a message saying so.
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-5}
steps=${2:-20}
py=/usr/bin/python3
configs=("1024 1024 1024 8 2" "256 512 512 8 2")
if [ -n "${MOE_BENCH_CONFIGS:-}" ]; then
  IFS=';' read -r -a configs <<<"$MOE_BENCH_CONFIGS"
fi
torch_only=${MOE_BENCH_TORCH_ONLY:-0}
read -r -a torch_args <<<"${MOE_BENCH_TORCH_ARGS:-}"

if ! $py -c 'import torch' 2>/dev/null; then
  echo "installing python3-torch" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-torch >&2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cores=$(nproc)

rev=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench' ':!docs' 2>/dev/null || echo "+work-tree")
if [ "$torch_only" = 1 ]; then
  echo "MOE_BENCH_TORCH_ONLY=1: PyTorch only, meshrun not built" >&2
else
  go build -o "$tmp/bin/" ./cmd/launcher ./cmd/worker
fi

# meshrun EP T H F E K S: runs the moe workload once and prints rank 0's JSON
# report (the launcher may stamp a prefix on each rank's lines); on failure,
# prints what went wrong and exits the script.
meshrun() {
  local ep=$1 t=$2 h=$3 f=$4 e=$5 k=$6 s=$7 log json
  log=$tmp/meshrun.log
  if ! GOMAXPROCS=$cores "$tmp/bin/launcher" run -n "$ep" --log-dir "$tmp/runs" moe --mesh "ep=$ep" \
    --tokens "$t" --hidden "$h" --ffn "$f" --experts "$e" --top-k "$k" --steps "$s" >"$log" 2>&1; then
    if grep -q 'unknown workload "moe"' "$log"; then
      echo "meshrun $rev has no moe workload (worker: unknown workload \"moe\"): build a meshrun that has it," >&2
      echo "or set MOE_BENCH_TORCH_ONLY=1 to run the PyTorch column alone" >&2
    else
      echo "meshrun ep=$ep failed (tokens $t hidden $h ffn $f experts $e top-k $k):" >&2
      tail -n 20 "$log" | sed 's/^/  /' >&2
    fi
    exit 1
  fi
  json=$(grep -o '{.*}' "$log" | grep '"step_ms_median"' | tail -n1 || true)
  if [ -z "$json" ]; then
    echo "meshrun ep=$ep printed no JSON report with step_ms_median (tokens $t hidden $h ffn $f experts $e top-k $k):" >&2
    tail -n 20 "$log" | sed 's/^/  /' >&2
    exit 1
  fi
  printf '%s\n' "$json"
}

if [ "$torch_only" != 1 ]; then
  # Fail early, on a tiny layer, if this meshrun has no moe workload.
  meshrun 1 8 8 8 2 1 1 >/dev/null
  for ep in 1 2; do
    echo "meshrun ep=$ep rank table:" >&2
    GOMAXPROCS=$cores "$tmp/bin/launcher" run -n "$ep" --dry-run --log-dir "$tmp/runs" moe --mesh "ep=$ep" 2>&1 |
      grep -A"$ep" '^NODE' | sed 's/^/  /' >&2
  done
fi
# The raw results outlive the run: by default a temporary file of their own,
# outside $tmp.
out=${MOE_BENCH_OUT:-$(mktemp --tmpdir moe-bench.XXXXXX.jsonl)}
: >"$out"
echo "meshrun $rev, $cores cores, torch $($py -c 'import torch; print(torch.__version__)'), raw results in $out" >&2

# Other work on the machine distorts every column: before each measurement wait
# (up to MOE_BENCH_QUIET seconds, default 60) until the CPUs are at least 80%
# idle over half a second; count the measurements that started without that.
loaded=0 total=0
wait_quiet() {
  local deadline=$((SECONDS + ${MOE_BENCH_QUIET:-60})) u n s i w q x y u2 n2 s2 i2 w2 q2 x2 y2 busy idle
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

# record TAG JSON: appends {...report, "impl": TAG, "rep": r, config fields} to $out.
record() {
  local impl=$1 json=$2
  case $json in
    \{*\"step_ms_median\"*) ;;
    *) echo "$impl printed no report (tokens $t hidden $h ffn $f experts $e top-k $k)" >&2; exit 1 ;;
  esac
  $py -c '
import json, sys
d = json.loads(sys.argv[3])
d["impl"], d["rep"] = sys.argv[1], int(sys.argv[2])
for name, v in zip(("tokens", "hidden", "ffn", "experts", "top_k"), sys.argv[4:]):
    d.setdefault(name, int(v))
print(json.dumps(d))' "$impl" "$r" "$json" "$t" "$h" "$f" "$e" "$k" >>"$out"
}

for r in $(seq "$reps"); do
  for cfg in "${configs[@]}"; do
    read -r t h f e k <<<"$cfg"
    echo "repetition $r/$reps: tokens $t hidden $h ffn $f experts $e top-k $k" >&2
    if [ "$torch_only" != 1 ]; then
      for ep in 1 2; do
        wait_quiet
        line=$(meshrun "$ep" "$t" "$h" "$f" "$e" "$k" "$steps")
        record "meshrun-ep$ep" "$line"
      done
    fi
    wait_quiet
    line=$($py bench/moe/torch_moe_hf.py --tokens "$t" --hidden "$h" --ffn "$f" \
      --experts "$e" --top-k "$k" --steps "$steps" --threads "$cores" "${torch_args[@]}")
    record torch "$line"
  done
done

$py - "$out" "$reps" "$steps" "$rev" "$cores" "$loaded" "$total" <<'PY'
import collections, json, sys

path, reps, steps, rev, cores, loaded, total = sys.argv[1:8]
best = {}
torch_version = "?"
order = []
for line in open(path):
    d = json.loads(line)
    key = (d["tokens"], d["hidden"], d["ffn"], d["experts"], d["top_k"])
    if key not in order:
        order.append(key)
    cell = (d["impl"],) + key
    if cell not in best or d["step_ms_median"] < best[cell]["step_ms_median"]:
        best[cell] = d
    if d["impl"] == "torch":
        torch_version = d.get("torch", "?")


def ms(impl, key):
    d = best.get((impl,) + key)
    return d["step_ms_median"] if d else None


def fmt(v):
    return "—" if v is None else f"{v:.2f}"


def ratio(a, b):
    return "—" if a is None or b is None else f"{a / b:.2f}"


print(f"meshrun {rev}, torch {torch_version}, {cores} cores (meshrun: GOMAXPROCS split over the ep ranks; "
      f"PyTorch: {cores} threads); {reps} repetitions of {steps} steps, each cell the best repetition's "
      "median forward + backward step.")
print()
print(f"{loaded} of {total} measurements started while other processes kept the CPUs more than 20% busy.")
print()
print("| config (tokens x hidden x ffn, experts, top-k) | meshrun ep=1 ms | meshrun ep=2 ms | torch ms "
      "| torch / meshrun (ep=1) | torch / meshrun (ep=2) |")
print("|---|---|---|---|---|---|")
for key in order:
    t, h, f, e, k = key
    m1, m2, pt = ms("meshrun-ep1", key), ms("meshrun-ep2", key), ms("torch", key)
    print(f"| {t} x {h} x {f}, E={e}, k={k} | {fmt(m1)} | {fmt(m2)} | {fmt(pt)} | {ratio(pt, m1)} | {ratio(pt, m2)} |")
PY
echo "raw results: $out" >&2
