#!/usr/bin/env bash
# Stand-ins for the GPU machine's tools, for bench/gpu/check.sh --dry on a
# machine without a GPU: check.sh links this script under each tool's name
# (nvidia-smi, nvcc, ptxas and python3 first on PATH; cuda.test and nccl.test
# beside the sim build of launcher and worker) and it answers as that tool
# would, with made-up figures: enough for check.sh's step, deadline, summary
# and archive logic, nothing about a GPU.
#
# For check.sh's tests, keyed by the step that runs the tool
# ($MESHRUN_CHECK_STEP, which check.sh sets for each step):
#   MESHRUN_FAKE_SLEEP="STEP=SECONDS ..."  each fake tool of STEP sleeps that
#                                          long first (a hang: a long sleep)
#   MESHRUN_FAKE_FAIL="STEP ..."           each fake tool of STEP fails as a
#                                          crashed test binary does (exit 2)
set -uo pipefail
tool=$(basename "$0")
step=${MESHRUN_CHECK_STEP:-}
for kv in ${MESHRUN_FAKE_SLEEP:-}; do
  if [ "${kv%%=*}" = "$step" ]; then sleep "${kv#*=}"; fi
done
for s in ${MESHRUN_FAKE_FAIL:-}; do
  if [ "$s" = "$step" ]; then
    echo "panic: $tool (fake) fails in step $step, as asked by MESHRUN_FAKE_FAIL" >&2
    exit 2
  fi
done

shapes="1x4096x4096 8x4096x4096 512x4096x4096 2048x4096x4096 4096x4096x4096 8192x4096x4096 4096x1024x4096"
version() { printf 'Cuda compilation tools, release 0.0, V0.0.0 (fake: check.sh --dry)\n'; }

case $tool in
nvidia-smi)
  case "$*" in
    *--query-gpu*) echo "Fake GPU (check.sh --dry), 000.00, 0 MiB, 0.0" ;;
    *) printf '| NVIDIA-SMI 000.00   Driver Version: 000.00   CUDA Version: 0.0 |\n| 0  Fake GPU (check.sh --dry) |\n' ;;
  esac ;;
nvcc) version ;;
ptxas)
  case "$*" in
    *--version*) version ;;
    *)
      for a; do
        case $a in
          *.ptx) sed -n 's/^\.visible \.entry \([A-Za-z0-9_]*\).*/ptxas info    : Compiling entry function '\''\1'\'' for '\''sm_90'\'' (fake)/p' "$a" || exit 1 ;;
        esac
      done ;;
  esac ;;
python3)
  case "${1:-}" in
    *torch_linear.py)
      for dt in float32 bfloat16; do
        for s in $shapes; do printf 'torch\t%s\t%s\tforward\t1.000\ntorch\t%s\t%s\tbackward\t1.000\n' "$dt" "$s" "$dt" "$s"; done
      done ;;
    *torch_mlp.py) printf '{"impl": "torch", "dtype": "%s", "step_ms_median": 1.0, "torch": "0.0.0+fake"}\n' "${5:-float32}" ;;
    *torch_gpt.py)
      printf '{"impl": "torch", "dtype": "%s", "step_ms_median": 1.0}\n' "${9:-float32}"
      [ -n "${10:-}" ] && printf 'torch profile: %s steps, %s (fake)\n' "${10}" "${9:-float32}" >&2 ;;
    -c)
      case "${2:-}" in
        *"import torch"*) printf 'torch=0.0.0+fake\ntorch_cuda=0.0\nnccl=0.0.0\ncublas=0.0.0 (fake)\n' ;;
        *) echo "python3 (fake, check.sh --dry): runs no other code" >&2; exit 1 ;;
      esac ;;
    *) echo "python3 (fake, check.sh --dry): runs no other code" >&2; exit 1 ;;
  esac ;;
cuda.test)
  run='' bench=''
  while [ $# -gt 0 ]; do
    case $1 in
      -test.run=*) run=${1#*=} ;;
      -test.run) run=${2:-}; shift ;;
      -test.bench=*) bench=${1#*=} ;;
      -test.bench) bench=${2:-}; shift ;;
    esac
    shift
  done
  if [ -n "$bench" ] && [ "$bench" != '^$' ]; then
    for dt in float32 bfloat16; do
      for s in $shapes; do
        for op in forward backward; do
          printf 'BenchmarkLinear/%s/%s/%s-16         \t     100\t     10000 ns/op\t         1.000 TFLOP/s\n' "$dt" "$s" "$op"
        done
      done
    done
    echo PASS
    exit 0
  fi
  case $run in
    *TestDispatchTable*)
      printf '=== RUN   TestDispatchTable\n    gemm float32 bias nn: cublaslt (fake)\n--- PASS: TestDispatchTable (0.00s)\nPASS\n' ;;
    *TestConformance*)
      dt=${run##*/}; dt=${dt#^}; dt=${dt%$}; dt=${dt#(}; dt=${dt%)}; dt=${dt%%|*}
      printf '=== RUN   TestConformance\n=== RUN   TestConformance/%s\n' "$dt"
      printf -- '--- PASS: TestConformance (0.00s)\n    --- PASS: TestConformance/%s (0.00s)\n' "$dt"
      for t in Gemm GemmBatched Linear Matmul Gelu Epilogues Elementwise Errors; do
        printf '        --- PASS: TestConformance/%s/%s (0.00s)\n' "$dt" "$t"
      done
      echo PASS ;;
    *) echo "testing: warning: no tests to run"; echo PASS ;;
  esac ;;
nccl.test) printf '=== RUN   TestWorldOfOne\n--- PASS: TestWorldOfOne (0.00s)\nPASS\n' ;;
*) echo "fake-tools.sh: no fake for $tool" >&2; exit 127 ;;
esac
