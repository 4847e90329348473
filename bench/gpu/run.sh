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
# and bfloat16, step times as medians after the warm-up. A part that fails
# leaves its rows out (linear) or says "failed" (MLP) and the rest runs.
#
# MESHRUN_BENCH_WORKER (default bin/worker), MESHRUN_BENCH_DEVICE (default
# cuda) and MESHRUN_BENCH_MLP_SHAPES (default "512 1024 4096,4096 4096 16384":
# tokens hidden ffn, comma-separated) set the MLP part; check.sh --dry runs it
# on sim.
#
# Last the GPT step: `worker gpt --device cuda` against torch_gpt.py (the same
# model, eager, scaled_dot_product_attention), float32 and bfloat16, at
# MESHRUN_BENCH_GPT_SHAPES (default "2 4 128 64 16,12 12 768 256 16": layers
# heads dim context batch), on the text MESHRUN_BENCH_GPT_DATA (default docs/).
# Then each side's profile of the larger shape on stderr: meshrun's
# --op-profile with MESHRUN_CUDA_SYNC=1 (each kernel's own time) and
# torch.profiler's kernel table. MESHRUN_BENCH_PARTS (default "linear mlp
# gpt") picks the tables; "ab" adds the bfloat16 backward's fused and
# split bias gradient and PyTorch's, alternating over rounds; "ncu" the
# kernels of the bfloat16 4096³ linear on each side as Nsight Compute times
# them; "pipeline" adds bench/pipeline/run.sh on this
# machine's CPU cores (pp=4, m=8, a core per rank: --cpus-per-rank 1), with
# the launcher and worker beside $worker. The MLP part ends with both sides'
# profiles of its last shape (meshrun's --op-profile, MESHRUN_CUDA_SYNC=1).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit
bin=${1:-bin/cuda.test}
secs=${2:-0.5}
worker=${MESHRUN_BENCH_WORKER:-bin/worker}
device=${MESHRUN_BENCH_DEVICE:-cuda}
shapes=${MESHRUN_BENCH_MLP_SHAPES:-512 1024 4096,4096 4096 16384}
gpt_shapes=${MESHRUN_BENCH_GPT_SHAPES:-2 4 128 64 16,12 12 768 256 16}
gpt_data=${MESHRUN_BENCH_GPT_DATA:-docs}
parts=" ${MESHRUN_BENCH_PARTS:-linear mlp gpt} " # which tables to make
part() { [[ $parts == *" $1 "* ]]; }
# row LABEL DTYPE MESHRUN_MS PYTORCH_MS: a step table's row, the ratio
# PyTorch / meshrun, or "failed" (and the exit status 1) when one is missing.
row() {
  if [ -n "$3" ] && [ -n "$4" ]; then
    awk -v s="$1" -v d="$2" -v m="$3" -v p="$4" 'BEGIN {printf "| %s | %s | %.3f | %.3f | %.2f× |\n", s, d, m, p, p / m}'
  else
    echo "| $1 | $2 | ${3:-failed} | ${4:-failed} | failed |"
    fail=1
  fi
}
# median: step_ms_median of the last JSON line read (meshrun's or PyTorch's).
median() { sed -n 's/.*"step_ms_median": *\([0-9.eE+-]*\).*/\1/p' | tail -n1; }
fail=0
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader >&2 || true
if part linear; then
"$bin" -test.run='^$' -test.bench='^BenchmarkLinear$' -test.benchtime="${secs}s" | tee "$out/meshrun.txt" |
  awk '/^BenchmarkLinear\// {split($1, p, "/"); for (i = 2; i <= NF; i++) if ($(i+1) == "TFLOP/s") v = $i;
       sub(/-[0-9]+$/, "", p[4]); printf "meshrun\t%s\t%s\t%s\t%s\n", p[2], p[3], p[4], v}' >"$out/meshrun"
python3 bench/gpu/torch_linear.py "$secs" >"$out/torch" || fail=1
[ -s "$out/meshrun" ] || { fail=1; echo "BenchmarkLinear gave no figures:" >&2; tail -n 20 "$out/meshrun.txt" >&2; }
echo "| dtype | tokens×in×out | op | meshrun TFLOP/s | PyTorch TFLOP/s | ratio |"
echo "|---|---|---|---|---|---|"
join -t $'\t' <(awk -F'\t' '{print $2"/"$3"/"$4"\t"$5}' "$out/meshrun" | sort) \
              <(awk -F'\t' '{print $2"/"$3"/"$4"\t"$5}' "$out/torch" | sort) |
  awk -F'\t' '{split($1, k, "/"); printf "| %s | %s | %s | %.2f | %.2f | %.2f× |\n", k[1], k[2], k[3], $2, $3, $2 / $3}'
# The bfloat16 backward again with the bias gradient apart from the weight
# gradient's GEMM (MESHRUN_BGRAD=split: PyTorch's way) instead of cuBLASLt's
# BGRADB, against the same PyTorch figures.
echo
echo "| bfloat16 backward, tokens×in×out | MESHRUN_BGRAD=split TFLOP/s | BGRADB (above) TFLOP/s | PyTorch TFLOP/s | split / PyTorch |"
echo "|---|---|---|---|---|"
MESHRUN_BGRAD=split "$bin" -test.run='^$' -test.bench='^BenchmarkLinear$/^bfloat16$/.*/^backward$' -test.benchtime="${secs}s" |
  awk '/^BenchmarkLinear\// {split($1, p, "/"); for (i = 2; i <= NF; i++) if ($(i+1) == "TFLOP/s") v = $i;
       printf "%s\t%s\n", p[3], v}' | sort >"$out/split"
join -t $'\t' "$out/split" <(awk -F'\t' '$2 == "bfloat16" && $4 == "backward" {print $3"\t"$5}' "$out/meshrun" | sort) |
  join -t $'\t' - <(awk -F'\t' '$2 == "bfloat16" && $4 == "backward" {print $3"\t"$5}' "$out/torch" | sort) |
  awk -F'\t' '{printf "| %s | %.2f | %.2f | %.2f | %.2f× |\n", $1, $2, $3, $4, $2 / $4}'

fi
if part mlp; then
echo
echo "| MLP step (tokens, hidden, ffn) | dtype | meshrun ms | PyTorch ms | ratio (PyTorch / meshrun) |"
echo "|---|---|---|---|---|"
IFS=, read -ra list <<<"$shapes"
for shape in "${list[@]}"; do
  # shellcheck disable=SC2086 # tokens hidden ffn
  set -- $shape
  for dt in float32 bfloat16; do
    m=$("$worker" mlp --device "$device" --tokens "$1" --hidden "$2" --ffn "$3" --steps 30 --dtype "$dt" | median)
    p=$(python3 bench/gpu/torch_mlp.py "$1" "$2" "$3" 30 "$dt" | median)
    row "$1, $2, $3" "$dt" "$m" "$p"
  done
done
# The profiles of the last shape (stderr): each side, float32 and bfloat16.
for dt in float32 bfloat16; do
  echo "== meshrun op profile: mlp $shape, $dt (MESHRUN_CUDA_SYNC=1)" >&2
  MESHRUN_CUDA_SYNC=1 "$worker" mlp --device "$device" --tokens "$1" --hidden "$2" --ffn "$3" --steps 8 --dtype "$dt" \
    --op-profile 2>&1 >/dev/null | sed -n '/^op profile/,$p' >&2
  [ "$device" = cuda ] && python3 bench/gpu/torch_mlp.py "$1" "$2" "$3" 4 "$dt" 5 >/dev/null
done

fi
if part gpt; then
echo
echo "| GPT step (layers, heads, dim, context×batch) | dtype | meshrun ms | PyTorch ms | ratio (PyTorch / meshrun) |"
echo "|---|---|---|---|---|"
IFS=, read -ra list <<<"$gpt_shapes"
for shape in "${list[@]}"; do
  # shellcheck disable=SC2086 # layers heads dim context batch
  set -- $shape
  for dt in float32 bfloat16; do
    line=$("$worker" gpt --device "$device" --layers "$1" --heads "$2" --dim "$3" --context "$4" --batch "$5" \
      --steps 20 --sample 0 --data "$gpt_data" --dtype "$dt" | tail -n1)
    m=$(median <<<"$line")
    vocab=$(sed -n 's/.*"vocab": *\([0-9]*\).*/\1/p' <<<"$line")
    p=
    [ -n "$vocab" ] && p=$(python3 bench/gpu/torch_gpt.py "$1" "$2" "$3" "$4" "$5" "$vocab" 20 "$dt" | median)
    row "$1, $2, $3, $4×$5" "$dt" "$m" "$p"
    # The same step on the block kernels (fused attention, layer norm a
    # block per row), against the same PyTorch step (its label's fourth
    # comma keeps it out of check.sh's summary).
    f=$(MESHRUN_CUDA_ATTENTION=fused MESHRUN_CUDA_LAYERNORM=block "$worker" gpt --device "$device" --layers "$1" --heads "$2" --dim "$3" --context "$4" \
      --batch "$5" --steps 20 --sample 0 --data "$gpt_data" --dtype "$dt" | median)
    row "$1, $2, $3, $4×$5, block kernels" "$dt" "$f" "$p"
  done
done
# The profiles, of the last shape (stderr): each side, float32 and
# bfloat16, and meshrun's on the block kernels.
for dt in float32 bfloat16; do
  for blocks in "" block; do
    echo "== meshrun op profile: gpt $shape, $dt${blocks:+, block kernels} (MESHRUN_CUDA_SYNC=1)" >&2
    MESHRUN_CUDA_ATTENTION=${blocks:+fused} MESHRUN_CUDA_LAYERNORM=$blocks MESHRUN_CUDA_SYNC=1 "$worker" gpt --device "$device" --layers "$1" --heads "$2" --dim "$3" \
      --context "$4" --batch "$5" --steps 6 --sample 0 --data "$gpt_data" --dtype "$dt" --op-profile 2>&1 >/dev/null |
      sed -n '/^op profile/,$p' >&2
  done
  [ -n "${vocab:-}" ] && python3 bench/gpu/torch_gpt.py "$1" "$2" "$3" "$4" "$5" "$vocab" 4 "$dt" 5 >/dev/null
done
fi
# ab: the bfloat16 linear backward at 2048, 4096 and 8192 tokens × 4096 ×
# 4096 and 4096 × 1024 × 4096, the bias gradient fused (BGRADB), split
# (MESHRUN_BGRAD=split) and PyTorch's, alternating, MESHRUN_BENCH_AB_ROUNDS
# rounds (default 3): each side's median TFLOP/s over the rounds.
if part ab; then
  ab='2048x4096x4096,4096x4096x4096,8192x4096x4096,4096x1024x4096'
  ab_meshrun() { # MESHRUN_BGRAD's value: shape and TFLOP/s per line
    MESHRUN_BGRAD=$1 "$bin" -test.run='^$' -test.bench="^BenchmarkLinear\$/^bfloat16\$/^(${ab//,/|})\$/^backward\$" \
      -test.benchtime="${secs}s" |
      awk '/^BenchmarkLinear\// {split($1, p, "/"); for (i = 2; i <= NF; i++) if ($(i+1) == "TFLOP/s") v = $i; printf "%s\t%s\n", p[3], v}'
  }
  for round in $(seq "${MESHRUN_BENCH_AB_ROUNDS:-3}"); do
    ab_meshrun "" | sed "s/^/fused\t$round\t/" >>"$out/ab"
    ab_meshrun split | sed "s/^/split\t$round\t/" >>"$out/ab"
    TORCH_LINEAR_ONLY="bfloat16 $ab backward" python3 bench/gpu/torch_linear.py "$secs" | cut -f3,5 | sed "s/^/torch\t$round\t/" >>"$out/ab"
  done
  echo
  echo "| bfloat16 backward, tokens×in×out | fused TFLOP/s (median of ${MESHRUN_BENCH_AB_ROUNDS:-3}) | split | PyTorch | fused / PyTorch | split / PyTorch |"
  echo "|---|---|---|---|---|---|"
  python3 - "$out/ab" <<'PY'
import statistics, sys
v = {}
for line in open(sys.argv[1]):
    side, _, shape, tf = line.split()
    v.setdefault(shape, {}).setdefault(side, []).append(float(tf))
for shape, s in sorted(v.items()):
    m = {k: statistics.median(x) for k, x in s.items()}
    f, sp, t = m.get("fused", 0), m.get("split", 0), m.get("torch", 0)
    r = lambda a: f"{a / t:.2f}×" if t else "—"
    print(f"| {shape} | {f:.1f} ({', '.join(f'{x:.0f}' for x in s.get('fused', []))}) | {sp:.1f} ({', '.join(f'{x:.0f}' for x in s.get('split', []))}) | {t:.1f} ({', '.join(f'{x:.0f}' for x in s.get('torch', []))}) | {r(f)} | {r(sp)} |")
PY
fi
# ncu: the kernels of the bfloat16 4096³ linear forward and backward, each
# side's, as Nsight Compute times them (gpu__time_duration, --clock-control
# none): name, calls, mean microseconds; where ncu is on the PATH.
if part ncu && command -v ncu >/dev/null; then
  ncu_table() { # SIDE CSV: ncu's CSV rows, by kernel
    python3 - "$1" "$2" <<'PY'
import csv, sys
side, rows = sys.argv[1], [l for l in open(sys.argv[2]) if l.startswith('"')]
k = {}
for r in csv.DictReader(rows):
    if r.get("Metric Name") == "gpu__time_duration.sum":
        k.setdefault(r["Kernel Name"][:90], []).append(float(r["Metric Value"].replace(",", "")))
for name, d in sorted(k.items(), key=lambda kv: -sum(kv[1])):
    print(f"| {side} | {name} | {len(d)} | {sum(d) / len(d) / 1e3:.1f} |")
PY
  }
  ncu_run() { ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base "$@"; }
  echo
  echo "| side | kernel (bfloat16 4096³ linear, forward and backward) | calls | mean µs |"
  echo "|---|---|---|---|"
  ncu_run "$bin" -test.run='^$' -test.bench='^BenchmarkLinear$/^bfloat16$/^4096x4096x4096$' -test.benchtime=3x >"$out/ncu-m.csv" 2>"$out/ncu-m.err" ||
    { fail=1; tail -n 5 "$out/ncu-m.err" >&2; }
  ncu_table meshrun "$out/ncu-m.csv"
  TORCH_LINEAR_ONLY="bfloat16 4096x4096x4096" ncu_run python3 bench/gpu/torch_linear.py 0.001 >"$out/ncu-t.csv" 2>"$out/ncu-t.err" ||
    { fail=1; tail -n 5 "$out/ncu-t.err" >&2; }
  ncu_table PyTorch "$out/ncu-t.csv"
fi
if part pipeline; then
  echo
  PIPE_BENCH_BIN=$(dirname "$worker") bench/pipeline/run.sh 3 4 8 8 || fail=1
fi
exit $fail
