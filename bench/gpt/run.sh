#!/usr/bin/env bash
# Times `worker gpt`'s training step against the same model in PyTorch on the
# gloo backend (bench/gpt/torch_gpt_tp.py: Megatron's tensor parallelism by
# hand, Debian's python3-torch), on the same CPU ranks, in one run, and prints
# a Markdown table.
#
#   bench/gpt/run.sh [repetitions] [steps]     (defaults: 3 repetitions, 20 steps)
#
# Each cell: tp = 1 and 2 processes, the machine's cores split evenly over
# the ranks (meshrun: GOMAXPROCS, as launcher run gives them; PyTorch:
# torch.set_num_threads). The runs alternate (meshrun, PyTorch, next cell,
# ..., repeat) so background load hits both alike; each cell is the best of
# the repetitions' median step times. GPT_BENCH_CONFIG="layers heads dim
# context batch" changes the model (default: 2 4 128 64 16, worker gpt's).
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
steps=${2:-20}
read -r layers heads dim context batch <<<"${GPT_BENCH_CONFIG:-2 4 128 64 16}"
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "bench/gpt: needs Debian's python3-torch" >&2; exit 1; }
go build -o bin/launcher ./cmd/launcher
go build -o bin/worker ./cmd/worker
cores=$(nproc)
vocab=$(bin/worker gpt --steps 1 --sample 0 --layers 0 2>/dev/null | tail -1 | sed -n 's/.*"vocab":\([0-9]*\).*/\1/p')
echo "# $(date -u +%FT%TZ) $cores cores, load $(cut -d' ' -f1-3 /proc/loadavg); vocab $vocab (the default corpus)" >&2
declare -A best
for rep in $(seq "$reps"); do
  for tp in 1 2; do
    ms=$(bin/launcher run -n "$tp" gpt --steps "$steps" --sample 0 --layers "$layers" --heads "$heads" --dim "$dim" \
      --context "$context" --batch "$batch" 2>/dev/null | tail -1 | sed -n 's/.*"step_ms_median":\([0-9.]*\).*/\1/p')
    best[m$tp]=$(python3 -c "print(min(float('${best[m$tp]:-1e9}'), $ms))")
    cfg="{\"vocab\":$vocab,\"dim\":$dim,\"heads\":$heads,\"layers\":$layers,\"context\":$context,\"batch\":$batch,\"steps\":$steps,\"threads\":$((cores / tp))}"
    port=$((29500 + RANDOM % 1000))
    for r in $(seq 0 $((tp - 1))); do
      MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$tp OMP_NUM_THREADS=$((cores / tp)) \
        /usr/bin/python3 bench/gpt/torch_gpt_tp.py "$cfg" >"/tmp/gpt-bench-$r.json" 2>/dev/null &
    done
    wait
    ms=$(sed -n 's/.*"step_ms_median": \([0-9.]*\).*/\1/p' /tmp/gpt-bench-0.json)
    best[t$tp]=$(python3 -c "print(min(float('${best[t$tp]:-1e9}'), $ms))")
    echo "rep $rep tp=$tp: meshrun ${best[m$tp]} ms, PyTorch ${best[t$tp]} ms (best so far)" >&2
  done
done
echo "| model (layers, heads, dim, context x batch) | tp | meshrun step ms | PyTorch (gloo) step ms | meshrun / PyTorch |"
echo "|---|---|---|---|---|"
for tp in 1 2; do
  python3 -c "m, t = ${best[m$tp]}, ${best[t$tp]}; print('| $layers, $heads, $dim, $context x $batch | $tp | %.1f | %.1f | %.2f |' % (m, t, m / t))"
done
