#!/usr/bin/env bash
# A linear layer's forward and backward on the GPU: meshrun's cuda provider
# (kernels/cuda BenchmarkLinear, cuBLASLt with the bias and bias-gradient
# epilogues) against PyTorch (F.linear and its autograd) on the same GPU, in
# one run, and prints a Markdown table with the ratios.
#
#   bench/gpu/run.sh [bin/cuda.test] [seconds]
#
# bin/cuda.test is what deploy/gpu.sh build makes (go test -tags cuda -c
# ./kernels/cuda), beside bin/worker. Needs python3 with torch (CUDA). Then
# the MLP block's training step, one rank on the GPU (bin/worker mlp
# --device cuda) against the same step in PyTorch (torch_mlp.py), float32
# and bfloat16, step times as medians after the warm-up.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-bin/cuda.test}
secs=${2:-0.5}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader >&2 || true
"$bin" -test.run='^$' -test.bench='^BenchmarkLinear$' -test.benchtime="${secs}s" |
  awk '/^BenchmarkLinear\// {split($1, p, "/"); for (i = 2; i <= NF; i++) if ($(i+1) == "TFLOP/s") v = $i;
       sub(/-[0-9]+$/, "", p[4]); printf "meshrun\t%s\t%s\t%s\t%s\n", p[2], p[3], p[4], v}' >"$out/meshrun"
python3 bench/gpu/torch_linear.py "$secs" >"$out/torch"
echo "| dtype | tokens×in×out | op | meshrun TFLOP/s | PyTorch TFLOP/s | ratio |"
echo "|---|---|---|---|---|---|"
join -t $'\t' <(awk -F'\t' '{print $2"/"$3"/"$4"\t"$5}' "$out/meshrun" | sort) \
              <(awk -F'\t' '{print $2"/"$3"/"$4"\t"$5}' "$out/torch" | sort) |
  awk -F'\t' '{split($1, k, "/"); printf "| %s | %s | %s | %.2f | %.2f | %.2f× |\n", k[1], k[2], k[3], $2, $3, $2 / $3}'

echo
echo "| MLP step (tokens, hidden, ffn) | dtype | meshrun ms | PyTorch ms | ratio (PyTorch / meshrun) |"
echo "|---|---|---|---|---|"
for shape in "512 1024 4096" "4096 4096 16384"; do
  set -- $shape
  for dt in float32 bfloat16; do
    m=$(bin/worker mlp --device cuda --tokens "$1" --hidden "$2" --ffn "$3" --steps 30 --dtype "$dt" | tail -n1 |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["step_ms_median"])')
    p=$(python3 bench/gpu/torch_mlp.py "$1" "$2" "$3" 30 "$dt" | python3 -c 'import json,sys; print(json.load(sys.stdin)["step_ms_median"])')
    awk -v s="$1, $2, $3" -v d="$dt" -v m="$m" -v p="$p" 'BEGIN {printf "| %s | %s | %.3f | %.3f | %.2f× |\n", s, d, m, p, p / m}'
  done
done
