#!/usr/bin/env bash
# The GPT's pipeline schedules measured (`launcher run gpt --mesh pp=P`, one
# core per rank): the step time, each stage's bubble (its idle share of a
# step, measured from the stage's trace: the median over the steps after
# the first) and its peak of micro-batches held, for GPipe, 1F1B and ZB-H1,
# in one run, printed as a Markdown table beside the modelled bubble
# (p−1)/(m+p−1).
#
#   bench/pipeline/run.sh [repetitions] [pp] [micro-batches] [steps]   (defaults: 3, 2, 8, 8)
#
# The schedules alternate within each repetition so that background load
# hits them alike; each cell is the repetition with the fastest median step
# (its bubbles beside it). The model: --layers 4·pp, --dim 128, --heads 4,
# --context 64, --batch 16 (PIPE_BENCH_ARGS adds flags). The launcher gives
# each rank its share of the machine's cores: with more ranks than cores
# they share them, and a stage's idle time then includes waiting for a
# core.
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
pp=${2:-2}
m=${3:-8}
steps=${4:-8}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/bin/" ./cmd/launcher ./cmd/worker
read -ra extra <<<"${PIPE_BENCH_ARGS:-}"
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD), $(nproc) cores, pp=$pp, m=$m, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for rep in $(seq "$reps"); do
  for s in gpipe 1f1b zb; do
    "$tmp/bin/launcher" run -n "$pp" gpt --mesh "pp=$pp" --micro-batches "$m" --schedule "$s" --layers $((4 * pp)) \
      --dim 128 --heads 4 --context 64 --batch 16 --steps "$steps" --sample 0 "${extra[@]}" 2>/dev/null |
      tail -n1 | sed 's/^[^{]*//' >"$tmp/$s.$rep.json"
    echo "rep $rep $s: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["step_ms_median"], r["pipeline"]["bubble"])' "$tmp/$s.$rep.json")" >&2
  done
done
python3 - "$tmp" "$reps" <<'PY'
import json, sys
tmp, reps = sys.argv[1], int(sys.argv[2])
best = {}
for s in ("gpipe", "1f1b", "zb"):
    runs = [json.load(open(f"{tmp}/{s}.{r}.json")) for r in range(1, reps + 1)]
    best[s] = min(runs, key=lambda r: r["step_ms_median"])
p = best["1f1b"]["pipeline"]
print(f"| schedule (pp={p['pp']}, m={p['micro_batches']}) | step ms | bubble per stage (measured) | mean | modelled | peak micro-batches per stage |")
print("|---|---|---|---|---|---|")
for s in ("gpipe", "1f1b", "zb"):
    r = best[s]; q = r["pipeline"]
    mean = sum(q["bubble"]) / len(q["bubble"])
    print(f"| {s} | {r['step_ms_median']:.1f} | {', '.join(f'{100*b:.1f}%' for b in q['bubble'])} | {100*mean:.1f}% | "
          f"{100*q['bubble_model']:.1f}% (gpipe, 1f1b) | {', '.join(map(str, q['peak_activations']))} |")
PY
