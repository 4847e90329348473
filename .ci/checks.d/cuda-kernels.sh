#!/usr/bin/env bash
# The cuda provider's CUDA C kernels, run on the CPU (thread by thread) against
# the cpu provider; and the embedded PTX is checked fresh by the package tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v g++ >/dev/null || { echo "cuda-kernels.sh: g++ not found" >&2; exit 1; }
CGO_ENABLED=1 .ci/gotest cuda-kernels -count=1 -tags cudaemu ./kernels/cuda/ptx/
