#!/usr/bin/env bash
# The GPT's pipeline schedules measured (`launcher run gpt --mesh pp=P`): the
# step time, each stage's bubble (its idle share of the pipeline's step, from
# the first action's start on any stage to the last's end on any, measured
# from the stages' traces: the median over the steps after the first) and
# its peak of micro-batches held (the bytes of their scratches, and of the
# workspace they share), for GPipe, 1F1B, the interleaved 1F1B (two chunks a
# stage), ZB-H1 and ZB-H2 (zb2), in one run, printed as a Markdown table
# beside the modelled bubble ((p−1)/(m+p−1); interleaved (p−1)/(2m+p−1)).
#
#   bench/pipeline/run.sh [repetitions] [pp] [micro-batches] [steps]   (defaults: 3, 2, 8, 8)
#
# The schedules alternate within each repetition so that background load
# hits them alike; each cell is the repetition with the fastest median step
# (its bubbles beside it; every repetition's step and mean bubble follow
# the table), with the bubble pipeline.Simulate gives the
# schedule at the stages' median F, B, W and send of that run (the measured
# bubble less it is noise, not the schedule) and those costs. The model:
# --layers 4·pp, --dim 256, --heads 4, --context 64, --batch 16
# (PIPE_BENCH_ARGS adds flags; at --dim 128 a forward on half a core is
# about 15 ms, a few of the quota's 4 ms bursts).
#
# One core per rank: each rank runs under `launcher run --cpus-per-rank C`
# (pinned, capped), C = 1 where the machine has a core per stage, else its
# cores shared out (0.5 for 4 stages on 2 cores: slower ranks, each at one
# speed; the quota's bursts add noise, docs/launcher.md). PIPE_BENCH_CPUS
# sets C; "none" runs uncapped (a stage's idle time then includes waiting
# for a core, and its turns run faster than its neighbours'). Without the
# right to make cgroups (root) a whole number of cores per rank is pinned
# alone (which caps it); a fraction runs uncapped, and the header says so. PIPE_BENCH_BIN names a folder holding prebuilt launcher and worker
# binaries (a machine without Go).
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
pp=${2:-2}
m=${3:-8}
steps=${4:-8}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=${PIPE_BENCH_BIN:-$tmp/bin}
[ -n "${PIPE_BENCH_BIN:-}" ] || go build -o "$tmp/bin/" ./cmd/launcher ./cmd/worker
read -ra extra <<<"${PIPE_BENCH_ARGS:-}"
cores=$(nproc)
cpus=${PIPE_BENCH_CPUS:-$(python3 -c "print(min(1, $cores / $pp))")}
cap=()
if [ "$cpus" != none ]; then
  if "$bin/launcher" run --dry-run -n "$pp" --cpus-per-rank "$cpus" -- true >/dev/null 2>"$tmp/cap.err"; then
    cap=(--cpus-per-rank "$cpus")
  else
    echo "# uncapped: $(cat "$tmp/cap.err")" >&2
    cpus=none
  fi
fi
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo prebuilt), $cores cores, pp=$pp, m=$m, cores per rank $cpus, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for rep in $(seq "$reps"); do
  for s in gpipe 1f1b interleaved zb zb2; do
    "$bin/launcher" run -n "$pp" "${cap[@]}" --log-dir "$tmp/runs" gpt --mesh "pp=$pp" --micro-batches "$m" --schedule "$s" --layers $((4 * pp)) \
      --dim 256 --heads 4 --context 64 --batch 16 --steps "$steps" --sample 0 "${extra[@]}" 2>/dev/null |
      tail -n1 | sed 's/^[^{]*//' >"$tmp/$s.$rep.json"
    echo "rep $rep $s: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["step_ms_median"], r["pipeline"]["bubble"])' "$tmp/$s.$rep.json")" >&2
  done
done
python3 - "$tmp" "$reps" <<'PY'
import json, sys
tmp, reps = sys.argv[1], int(sys.argv[2])
best = {}
schedules = ("gpipe", "1f1b", "interleaved", "zb", "zb2")
for s in schedules:
    runs = [json.load(open(f"{tmp}/{s}.{r}.json")) for r in range(1, reps + 1)]
    best[s] = min(runs, key=lambda r: r["step_ms_median"])
p = best["1f1b"]["pipeline"]
mean = lambda v: sum(v) / len(v)
model = lambda s, q: f"{100*q['bubble_model']:.1f}%" if s in ("gpipe", "1f1b", "interleaved") else "—"
print(f"| schedule (pp={p['pp']}, m={p['micro_batches']}) | step ms | bubble per stage (measured) | mean | at the median costs | modelled | peak micro-batches per stage (their scratch + the workspace) |")
print("|---|---|---|---|---|---|---|")
for s in schedules:
    r = best[s]; q = r["pipeline"]
    print(f"| {s} | {r['step_ms_median']:.1f} | {', '.join(f'{100*b:.1f}%' for b in q['bubble'])} | {100*mean(q['bubble']):.1f}% | "
          f"{100*mean(q['bubble_at_cost']):.1f}% | {model(s, q)} | {', '.join(f'{k} ({b / 2**20:.1f} + {w / 2**20:.1f} MiB)' for k, b, w in zip(q['peak_activations'], q['scratch_bytes'], q['workspace_bytes']))} |")
print()
print("Every repetition's step (ms) and mean bubble, in order: " + "; ".join(
    s + " " + ", ".join("%.1f (%.1f%%)" % (r["step_ms_median"], 100 * mean(r["pipeline"]["bubble"]))
                        for r in [json.load(open(f"{tmp}/{s}.{k}.json")) for k in range(1, reps + 1)])
    for s in schedules))
print()
print("| schedule | median F, B, W per stage (ms) | median send (ms) |")
print("|---|---|---|")
for s in schedules:
    q = best[s]["pipeline"]
    fbw = "; ".join("%.1f, %.1f, %.1f" % (c["F"], c["B"], c["W"]) for c in q["cost_ms"])
    print(f"| {s} | {fbw} | {', '.join(f'{x:.2f}' for x in q['send_ms'])} |")
print()
# The measures docs/pipeline.md reads off the table, from the same rows.
bub = {s: mean(best[s]["pipeline"]["bubble"]) for s in schedules}
own = {s: mean(best[s]["pipeline"].get("overhead") or [0]) for s in schedules}
step = {s: best[s]["step_ms_median"] for s in schedules}
print(f"- 1F1B's bubble {100*bub['1f1b']:.1f}% is {bub['1f1b'] / p['bubble_model']:.2f}× its model (p−1)/(m+p−1) = {100*p['bubble_model']:.1f}%, "
      f"{bub['1f1b'] / mean(p['bubble_at_cost']):.2f}× the model at the run's median costs ({100*mean(p['bubble_at_cost']):.1f}%)")
print(f"- against 1F1B's bubble: zb {bub['zb'] / bub['1f1b']:.2f}×, zb2 {bub['zb2'] / bub['1f1b']:.2f}×, interleaved {bub['interleaved'] / bub['1f1b']:.2f}×")
print("- steps, fastest first: " + " < ".join(f"{s} {step[s]:.1f}" for s in sorted(schedules, key=lambda s: step[s])))
print("- the stages' own time between actions (mean): " + ", ".join(f"{s} {100*own[s]:.2f}%" for s in schedules))
rep = {s: mean(best[s]["pipeline"].get("bubble_replayed") or [0]) for s in schedules}
print("- mean bubble measured / replayed at the actions' own times / at their median costs: " +
      ", ".join(f"{s} {100*bub[s]:.1f} / {100*rep[s]:.1f} / {100*mean(best[s]['pipeline']['bubble_at_cost']):.1f}%" for s in schedules))
PY
