#!/usr/bin/env bash
# Ring attention's speed and memory against one rank (`launcher run attention`,
# package ring): the causal attention forward and backward of one sequence,
# one core per rank, in one run, printed as a Markdown table.
#
#   bench/attention/run.sh [repetitions] [steps] [seq]   (defaults: 3, 3, 4096)
#
# Three ways, alternating within each repetition so that background load hits
# them alike:
#   cp=1             GOMAXPROCS=1 launcher run -n 1 attention --mesh cp=1
#   cp=2 zigzag      GOMAXPROCS=2 launcher run -n 2 attention --mesh cp=2 --layout zigzag
#   cp=2 contiguous  GOMAXPROCS=2 launcher run -n 2 attention --mesh cp=2 --layout contiguous
# The launcher gives each rank its share of its GOMAXPROCS: one core each.
# Each cell is the best (minimum) of the repetitions' median steps; memory is
# rank 0's: the most heap the step used above what was live before it, and
# the most keys and values (with gradients) its ring held at once.
# ATTN_BENCH_ARGS adds flags to every run (e.g. "--heads 8 --dim 64").
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
steps=${2:-3}
seq=${3:-4096}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/bin/" ./cmd/launcher ./cmd/worker
rev=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench' ':!docs' 2>/dev/null || echo "+work-tree")
read -ra extra <<<"${ATTN_BENCH_ARGS:-}"
out=${ATTN_BENCH_OUT:-$(mktemp /tmp/attn-bench.XXXXXX.jsonl)}
: >"$out"

run() { # NAME PROCS N LAYOUT
  GOMAXPROCS=$2 "$tmp/bin/launcher" run -n "$3" --log-dir "$tmp/runs" attention --mesh "cp=$3" --seq "$seq" \
    --layout "$4" --steps "$steps" "${extra[@]}" 2>&1 | grep -o '{"mesh".*}' | tail -n1 |
    sed "s/^{/{\"name\":\"$1\",/" >>"$out"
}
for r in $(seq 1 "$reps"); do
  echo "repetition $r/$reps" >&2
  run cp1 1 1 zigzag
  run cp2-zigzag 2 2 zigzag
  run cp2-contiguous 2 2 contiguous
done

python3 - "$out" "$rev" "$seq" "$steps" "$reps" <<'EOF'
import json, sys
path, rev, seq, steps, reps = sys.argv[1:]
best = {}
for line in open(path):
    r = json.loads(line)
    b = best.get(r["name"])
    if b is None or r["step_ms_median"] < b["step_ms_median"]:
        best[r["name"]] = r
one = best["cp1"]
print(f"meshrun {rev}, causal attention S={seq}, {one['heads']} heads of {one['dim']}, batch {one['batch']}; "
      f"one core per rank; best of {reps} repetitions' median of {steps} steps\n")
print("| run | step ms | forward ms | backward ms | / cp=1 | heap peak MiB | / cp=1 | K/V held MiB | sent MiB |")
print("|---|---|---|---|---|---|---|---|---|")
for name in ["cp1", "cp2-zigzag", "cp2-contiguous"]:
    r = best[name]
    print(f"| {name} | {r['step_ms_median']:.1f} | {r['forward_ms_median']:.1f} | {r['backward_ms_median']:.1f} | "
          f"{r['step_ms_median'] / one['step_ms_median']:.3f} | {r['heap_peak_bytes'] / 2**20:.1f} | "
          f"{r['heap_peak_bytes'] / one['heap_peak_bytes']:.3f} | {r['kv_peak_bytes'] / 2**20:.1f} | {r['sent_bytes'] / 2**20:.1f} |")
z, c = best["cp2-zigzag"], best["cp2-contiguous"]
print(f"\nzigzag / contiguous at cp=2: {z['step_ms_median'] / c['step_ms_median']:.3f}")
EOF
echo "raw results: $out" >&2
